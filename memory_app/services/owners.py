"""Everything one owner has: export it, or erase it in one transaction.

``Memory.export_owner(user)`` / ``Memory.erase_owner(user)`` are the entry points (the
``memory_owner`` command and the ``owner/export/`` and ``owner/erase/`` API endpoints call
them). An owner export is a list of session exports in the format ``SessionMemory.export()``
writes, so each one can be restored with ``Memory.import_session``, plus the owner's store items
and the LangGraph checkpoints of their threads (to read; import restores sessions only).

Deleting sessions goes through ``store.sessions.delete_rows``: one ``DELETE`` per table, children
first (embeddings, messages, snapshots, sessions), instead of Django's deletion collector,
which loads every message of a session into memory to find what cascades from it.
``SessionMemory.clear()`` and ``delete()`` use it too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth import get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, router, transaction
from django.db.models import Exists, OuterRef, Sum
from django.utils import timezone

from ..exceptions import InvalidOwner
from ..models import Checkpoint, Item, Session
from ..store import checkpoints, items, reads, sessions, snapshots
from ..store.transfer import export_head, message_fields, snapshot_fields
from ..types import ANY_OWNER, ErasedRows, StoredCheckpoint

OWNER_EXPORT_FORMAT = "memory_app.owner"
OWNER_EXPORT_VERSION = 1

#: Messages read per query while exporting.
EXPORT_BATCH_SIZE = 1000


def owner_pk(owner: Any) -> Any:
    """The primary key of ``owner`` (a user or a primary key); refuses "no owner" and ANY_OWNER.

    Ownerless sessions belong to nobody, so there is nobody to export them to or erase them for.
    """
    if owner is None or owner is ANY_OWNER or isinstance(owner, bool):
        raise InvalidOwner(
            "an owner (a user or its primary key) is required; ownerless sessions belong to nobody"
        )
    return getattr(owner, "pk", owner)


def erase_owner(owner: Any, *, progress: Callable[[str, int], None] | None = None) -> ErasedRows:
    """Delete every session of ``owner`` with its messages, snapshots, embeddings and metadata,
    in one transaction; returns the rows removed per table. Other owners' rows are untouched.

    The owner's user row is locked first (``FOR UPDATE`` on PostgreSQL), so a session being
    created for them meanwhile waits for the erase and lands after it, never half inside it;
    their sessions are locked too, so an append in flight either committed before (and is
    erased) or fails afterwards with ``SessionNotFound``.
    """
    pk = owner_pk(owner)
    using = router.db_for_write(Session)
    with transaction.atomic(using=using):
        list(
            get_user_model()
            ._default_manager.using(using)
            .select_for_update()
            .filter(pk=pk)
            .values_list("pk", flat=True)
        )
        owned = Session.objects.using(using).filter(owner_id=pk)
        list(owned.select_for_update().order_by("pk").values_list("pk", flat=True))
        return sessions.delete_rows(owned, owner_id=pk, progress=progress)


# -- exporting ---------------------------------------------------------------------------------


@contextmanager
def _consistent_reads(using: str) -> Iterator[None]:
    """A transaction whose reads all see one snapshot of the database.

    On PostgreSQL that needs REPEATABLE READ, set as the transaction's first statement, which
    is only possible when this is the outermost transaction; inside a caller's transaction the
    caller's isolation applies. SQLite transactions read one snapshot anyway.
    """
    connection = connections[using]
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=using):
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def owner_summary(owner: Any) -> dict[str, int]:
    """``{"sessions": n, "messages": n}`` of ``owner`` now (stored counters: no scan)."""
    totals = Session.objects.filter(owner_id=owner_pk(owner)).aggregate(
        messages=Sum("message_count")
    )
    return {
        "sessions": Session.objects.filter(owner_id=owner_pk(owner)).count(),
        "messages": totals["messages"] or 0,
    }


def iter_owner_export(
    owner: Any,
    *,
    batch_size: int = EXPORT_BATCH_SIZE,
    progress: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """The owner's export as JSON text, in pieces: a session's messages are read and written
    ``batch_size`` at a time, so memory use does not grow with the owner's history.

    Everything is read in one transaction (one snapshot on PostgreSQL). ``progress(messages)``
    is called after each batch. ``json.loads("".join(...))`` equals ``export_owner(owner)``.
    """
    pk = owner_pk(owner)
    using = router.db_for_read(Session)

    def dumps(value: Any) -> str:
        return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False)

    with _consistent_reads(using):
        head = {
            "format": OWNER_EXPORT_FORMAT,
            "version": OWNER_EXPORT_VERSION,
            "owner": {"id": pk},
            "exported_at": timezone.now().isoformat(),
        }
        yield dumps(head)[:-1] + ', "sessions": ['
        owned = Session.objects.filter(owner_id=pk).order_by("created_at", "pk")
        for index, session in enumerate(owned.iterator(chunk_size=100)):
            yield ("," if index else "") + dumps(export_head(session))[:-1] + ', "messages": ['
            after, first = 0, True
            while True:
                # Bounded by next_seq as read above: a message appended since is not half in.
                batch = reads.messages(
                    session.pk, after=after, before=session.next_seq, limit=batch_size
                )
                if not batch:
                    break
                yield ("" if first else ",") + ",".join(dumps(message_fields(m)) for m in batch)
                first = False
                after = batch[-1].cursor
                if progress is not None:
                    progress(len(batch))
                if len(batch) < batch_size:
                    break  # the last batch: no query for an empty one
            yield (
                '], "snapshots": '
                + dumps([snapshot_fields(v) for v in snapshots.lineage(session.pk)])
                + "}"
            )
        yield '], "items": ' + dumps([item_fields(i) for i in owned_items(pk)])
        yield ', "checkpoints": ['
        first = True
        threads = Session.objects.filter(
            Exists(Checkpoint.objects.filter(session=OuterRef("pk"))), owner_id=pk
        )
        for stored in checkpoints.iter_query(threads):
            yield ("" if first else ",") + dumps(checkpoint_fields(stored))
            first = False
        yield "]}"


def owned_items(owner_pk: Any):
    """Every item of the owner, superseded and expired versions too (an export hides nothing)."""
    return Item.objects.filter(owner_id=owner_pk).order_by("namespace", "key", "valid_from")


def item_fields(item: Item) -> dict[str, Any]:
    return {
        "namespace": list(items.split(item.namespace)),
        "key": item.key,
        "value": item.value,
        "kind": item.kind,
        "session": item.session_id,
        "source_cursors": item.source_cursors,
        "importance": item.importance,
        "valid_from": item.valid_from,
        "invalid_at": item.invalid_at,
        "created_at": item.created_at,
        "updated_at": item.updated_at,
        "expires_at": item.expires_at,
    }


def checkpoint_fields(stored: StoredCheckpoint) -> dict[str, Any]:
    def encoded(kind: str, data: bytes) -> dict[str, str]:
        return {"type": kind, "base64": base64.b64encode(data).decode("ascii")}

    return {
        "session": stored.session_id,
        "thread_id": stored.thread_id,
        "checkpoint_ns": stored.checkpoint_ns,
        "checkpoint_id": stored.checkpoint_id,
        "parent_checkpoint_id": stored.parent_checkpoint_id,
        "checkpoint": stored.checkpoint,
        "metadata": stored.metadata,
        "channel_values": {ch: encoded(*typed) for ch, typed in stored.values.items()},
        "pending_writes": [
            {"task_id": task, "channel": channel, **encoded(kind, data)}
            for task, channel, kind, data in stored.writes
        ],
        "created_at": stored.created_at,
    }


def export_owner(owner: Any) -> dict[str, Any]:
    """Everything of ``owner`` as JSON-serialisable data: ``{"format": "memory_app.owner",
    "version": 1, "owner": {"id": ...}, "exported_at": ..., "sessions":
    [<SessionMemory.export()>, ...], "items": [...], "checkpoints": [...]}`` (store items in
    every version; LangGraph checkpoints with their values and writes in base64, decrypted).
    For large owners prefer ``iter_owner_export``, which streams."""
    return json.loads("".join(iter_owner_export(owner)))
