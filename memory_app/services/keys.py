"""Key rotation: every stored text under the newest of ``ENCRYPTION_KEYS``.

Messages encrypted with an older key are re-encrypted with the first key of the list; messages
written before encryption was turned on (plaintext) are encrypted; texts kept for recall after
their message was pruned (on the embedding row) likewise. Rows already under the newest key are
left alone, so an interrupted rotation can simply start again. Each batch is one transaction,
its rows locked while they are rewritten.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import router, transaction
from django.db.models import QuerySet

from .. import encryption
from ..exceptions import NoEncryptionKey
from ..models import Embedding, Message


def stored_messages() -> int:
    """How many messages a rotation reads (for a progress bar)."""
    return Message.objects.using(router.db_for_write(Message)).count()


def rotate(
    batch_size: int = 500, *, progress: Callable[[int], None] | None = None
) -> dict[str, int]:
    """Re-encrypt what is not under the newest key; ``progress(messages)`` after each batch of
    messages. Returns ``{"messages", "rewritten", "kept_texts"}``."""
    if not encryption.enabled():
        raise NoEncryptionKey(
            "MEMORY_APP['ENCRYPTION_KEYS'] is empty: there is no key to encrypt with"
        )
    using = router.db_for_write(Message)

    def message(row: Message) -> bool:
        new = encryption.stored_values(row.content, row.content_parts, row.tool_calls)
        if new is None:
            return False
        row.content, row.content_parts, row.tool_calls = new
        # The full-text vector was made from the old stored value (the plaintext, for a row
        # written before encryption): it goes with it.
        row.search_vector = None
        return True

    def kept_text(row: Embedding) -> bool:
        new = encryption.stored_values(row.content, None, None)
        if new is None:
            return False
        row.content = new[0]
        return True

    seen, rewritten = _rewrite(
        Message.objects.using(using),
        ("content", "content_parts", "tool_calls", "search_vector"),
        message,
        batch_size,
        progress,
    )
    kept = Embedding.objects.using(using).filter(message__isnull=True).exclude(content="")
    _, kept_rewritten = _rewrite(kept, ("content",), kept_text, batch_size, None)
    return {"messages": seen, "rewritten": rewritten, "kept_texts": kept_rewritten}


def _rewrite(
    rows: QuerySet,
    fields: tuple[str, ...],
    change: Callable[[object], bool],
    batch_size: int,
    progress: Callable[[int], None] | None,
) -> tuple[int, int]:
    """Lock ``rows`` a batch at a time (keyset by id), ``change`` each, write the changed ones
    back; ``(rows seen, rows rewritten)``."""
    seen = rewritten = 0
    last_id = 0
    while True:
        with transaction.atomic(using=rows.db):
            batch = list(
                rows.filter(id__gt=last_id)
                .order_by("id")
                .select_for_update()
                .only("id", *(f for f in fields if f != "search_vector"))[:batch_size]
            )
            if not batch:
                return seen, rewritten
            changed = [row for row in batch if change(row)]
            if changed:
                rows.model.objects.using(rows.db).bulk_update(changed, list(fields))
        last_id = batch[-1].id
        seen += len(batch)
        rewritten += len(changed)
        if progress is not None:
            progress(len(batch))
