"""Receivers of the append signal: the work that follows an append, scheduled in the background.

``messages_appended`` is sent inside the append's transaction. Important messages are promoted
(``remember=True``) in that same transaction; embedding and the summarize threshold are
scheduled with ``transaction.on_commit`` (a rolled-back append starts nothing), ``robust=True``
so an unreachable broker never fails an append that has already committed.
"""

from __future__ import annotations

from django.db import router, transaction

from .conf import memory_settings
from .models import Message
from .services import background, embedding
from .signals import messages_appended
from .types import StoredMessage


def embed_after_append(sender, session_id, messages: list[StoredMessage], **kwargs) -> None:
    """Promote important messages now; embed the new ones once the append commits."""
    if not messages:
        return
    promoted = embedding.promote_important(session_id, messages)
    for index, message in enumerate(promoted):
        # The list is what append() returns: let the caller see the stored flag.
        messages[index] = message
    cursors = embedding.wanted_cursors(promoted)
    if cursors:

        def embed() -> None:  # a plain function: robust on_commit logs callbacks by __qualname__
            background.schedule_embedding(session_id, cursors=cursors)

        transaction.on_commit(embed, using=router.db_for_write(Message), robust=True)


def summarize_after_append(
    sender, session_id, messages, tokens_since_snapshot=None, **kwargs
) -> None:
    """Once the append commits, schedule summarization if the session went over the threshold."""
    threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
    if threshold is None or not messages:
        return
    if tokens_since_snapshot is not None and tokens_since_snapshot <= threshold:
        return  # the append statement told us: under the threshold, no query needed

    def check() -> None:
        background.summarize_if_needed(session_id)

    transaction.on_commit(check, using=router.db_for_write(Message), robust=True)


def connect() -> None:
    """Connect the receivers (called from the app's ``ready()``)."""
    messages_appended.connect(
        embed_after_append, dispatch_uid="memory_app.receivers.embed_after_append"
    )
    messages_appended.connect(
        summarize_after_append, dispatch_uid="memory_app.receivers.summarize_after_append"
    )
