"""LangGraph's state, kept under the session its thread is: checkpoints, channel values, writes.

The store knows nothing of LangGraph's types: a checkpoint arrives as JSON (its ids and channel
versions, without values) plus its channel values as the framework serialised them, ``(type,
bytes)`` per channel and version; a pending write as ``(idx, channel, type, bytes)``. That keeps
the one thing LangGraph owns (its serialiser) in ``integrations.langgraph`` and everything this
app owns here: owner scoping (a thread is the session ``key`` of an owner and namespace, so
another owner's thread is simply not found), encryption at rest of every value, and deletion.

Rules kept here:

- A channel value is stored once per (channel, version): a step that changes one channel writes
  one value, and ``get`` reads the versions its checkpoint names.
- ``put`` is an upsert of the checkpoint row and an insert-if-missing of its values, in one
  transaction that also moves the session's ``updated_at`` (and a sliding expiry), so idle
  retention sees a thread in use.
- A pending write is keyed by (checkpoint, task, idx): a retried task stores nothing twice;
  special channels (errors, interrupts: negative idx) replace what they stored.
- ``prune(keep=n)`` keeps the newest ``n`` checkpoints of each namespace of a thread with their
  writes and the values they name, and deletes the rest; ``keep=0`` deletes them all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.db import connections, router, transaction
from django.db.models import CharField, F, Q, QuerySet, Value
from django.utils import timezone

from ..encryption import decrypt_bytes, encrypt_bytes
from ..models import Checkpoint, CheckpointBlob, CheckpointWrite, Session
from ..types import StoredCheckpoint
from . import policies, sessions

#: Channel values with no value (the channel was emptied) are stored with this type.
EMPTY = "empty"
#: Rows read or copied per query when a thread is copied or pruned.
CHUNK = 500


def _write_db() -> str:
    return router.db_for_write(Checkpoint)


def threads(owner: Any, namespace: str) -> QuerySet:
    """The sessions that are threads of ``owner`` in ``namespace``."""
    return sessions.scoped(owner).filter(namespace=namespace)


def thread_session(owner: Any, namespace: str, thread_id: str, *, create: bool = False):
    """The id of the session of thread ``thread_id``, created when missing if ``create`` (else
    ``None`` when there is none)."""
    if create:
        return sessions.get_or_create(thread_id, owner=owner, namespace=namespace).pk
    return threads(owner, namespace).filter(key=thread_id).values_list("pk", flat=True).first()


def _touch(session_id: uuid.UUID) -> None:
    now = timezone.now()
    changes: dict[str, Any] = {"updated_at": now}
    if (expiry := policies.sliding_expiry(now)) is not None:
        changes["expires_at"] = expiry
    Session.objects.filter(pk=session_id).update(**changes)


# ---- writing -------------------------------------------------------------------------------------
def put(
    session_id: uuid.UUID,
    *,
    checkpoint_ns: str,
    checkpoint: dict,
    metadata: dict,
    run_id: str,
    parent_checkpoint_id: str,
    values: Iterable[tuple[str, str, str, bytes | None]],
) -> None:
    """Store a checkpoint (``checkpoint["id"]``) and the channel values new in it, given as
    ``(channel, version, type, bytes)``; a value already stored for that version is kept."""
    with transaction.atomic(using=_write_db()):
        blobs = [
            CheckpointBlob(
                session_id=session_id,
                checkpoint_ns=checkpoint_ns,
                channel=channel,
                version=version,
                type=kind,
                blob=encrypt_bytes(data),
            )
            for channel, version, kind, data in values
        ]
        if blobs:
            CheckpointBlob.objects.bulk_create(blobs, ignore_conflicts=True)
        Checkpoint.objects.bulk_create(
            [
                Checkpoint(
                    session_id=session_id,
                    checkpoint_ns=checkpoint_ns,
                    checkpoint_id=checkpoint["id"],
                    parent_checkpoint_id=parent_checkpoint_id,
                    run_id=run_id,
                    checkpoint=checkpoint,
                    metadata=metadata,
                )
            ],
            update_conflicts=True,
            unique_fields=["session", "checkpoint_ns", "checkpoint_id"],
            update_fields=["parent_checkpoint_id", "run_id", "checkpoint", "metadata"],
        )
        _touch(session_id)


def put_writes(
    session_id: uuid.UUID,
    *,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: Sequence[tuple[int, str, str, bytes | None]],
    replace: bool,
) -> None:
    """Store a task's writes ``(idx, channel, type, bytes)`` for a checkpoint. A write already
    stored under the same (task, idx) is kept, or replaced when ``replace`` (special channels:
    the latest error or interrupt of a task is the one that counts)."""
    rows = [
        CheckpointWrite(
            session_id=session_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            task_id=task_id,
            task_path=task_path,
            idx=idx,
            channel=channel,
            type=kind,
            blob=encrypt_bytes(data),
        )
        for idx, channel, kind, data in writes
    ]
    if not rows:
        return
    unique = ["session", "checkpoint_ns", "checkpoint_id", "task_id", "idx"]
    with transaction.atomic(using=_write_db()):
        if replace:
            CheckpointWrite.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=unique,
                update_fields=["channel", "type", "blob", "task_path"],
            )
        else:
            CheckpointWrite.objects.bulk_create(rows, ignore_conflicts=True)


# ---- reading -------------------------------------------------------------------------------------
def _loaded(rows: list[Checkpoint]) -> list[StoredCheckpoint]:
    """Rows (with ``session__key`` as ``thread_id``) with their values and writes: two queries
    for the whole page, not two per checkpoint."""
    if not rows:
        return []
    wanted: set[tuple] = set()
    blob_filter, write_filter = Q(), Q()
    for row in rows:
        versions = row.checkpoint.get("channel_versions") or {}
        for channel, version in versions.items():
            wanted.add((row.session_id, row.checkpoint_ns, channel, str(version)))
        if versions:
            blob_filter |= Q(
                session_id=row.session_id,
                checkpoint_ns=row.checkpoint_ns,
                channel__in=list(versions),
            )
        write_filter |= Q(
            session_id=row.session_id,
            checkpoint_ns=row.checkpoint_ns,
            checkpoint_id=row.checkpoint_id,
        )
    values: dict[tuple, tuple[str, bytes]] = {}
    if wanted:
        versions_wanted = sorted({w[3] for w in wanted})
        for blob in CheckpointBlob.objects.filter(blob_filter, version__in=versions_wanted).only(
            "session_id", "checkpoint_ns", "channel", "version", "type", "blob"
        ):
            place = (blob.session_id, blob.checkpoint_ns, blob.channel, blob.version)
            if place in wanted and blob.type != EMPTY:
                values[place] = (blob.type, decrypt_bytes(blob.blob) or b"")
    writes: dict[tuple, list] = {}
    for write in CheckpointWrite.objects.filter(write_filter).order_by(
        "task_path", "task_id", "idx"
    ):
        writes.setdefault((write.session_id, write.checkpoint_ns, write.checkpoint_id), []).append(
            (write.task_id, write.channel, write.type, decrypt_bytes(write.blob) or b"")
        )
    loaded = []
    for row in rows:
        versions = row.checkpoint.get("channel_versions") or {}
        channel_values = {}
        for channel, version in versions.items():
            found = values.get((row.session_id, row.checkpoint_ns, channel, str(version)))
            if found is not None:
                channel_values[channel] = found
        loaded.append(
            StoredCheckpoint(
                session_id=row.session_id,
                thread_id=row.thread_id,
                checkpoint_ns=row.checkpoint_ns,
                checkpoint_id=row.checkpoint_id,
                parent_checkpoint_id=row.parent_checkpoint_id,
                checkpoint=row.checkpoint,
                metadata=row.metadata,
                values=channel_values,
                writes=writes.get((row.session_id, row.checkpoint_ns, row.checkpoint_id), []),
                created_at=row.created_at,
            )
        )
    return loaded


def _metadata_matches(qs: QuerySet, wanted: dict[str, Any]) -> QuerySet:
    if not wanted:
        return qs
    if connections[qs.db].vendor == "postgresql":
        return qs.filter(metadata__contains=wanted)  # jsonb @>: every key, nested too
    for key, value in wanted.items():
        qs = qs.filter(**{f"metadata__{key}": value})
    return qs


def query(
    thread_sessions: QuerySet,
    *,
    thread_id: str | None = None,
    checkpoint_ns: str | None = None,
    checkpoint_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    before: str | None = None,
    limit: int | None = None,
) -> list[StoredCheckpoint]:
    """Checkpoints of the given sessions, newest first (by id, which is time-ordered), narrowed
    to one thread, namespace, checkpoint, metadata subset, ids before ``before``, and ``limit``."""
    if thread_id is not None:
        # One thread: its session first, so the checkpoint index serves "newest first" with a
        # limit (a join would have the planner read and sort every checkpoint of the thread).
        session_id = thread_sessions.filter(key=thread_id).values_list("pk", flat=True).first()
        if session_id is None:
            return []
        qs = Checkpoint.objects.filter(session_id=session_id).annotate(
            thread_id=Value(thread_id, output_field=CharField())
        )
    else:
        qs = Checkpoint.objects.filter(session__in=thread_sessions).annotate(
            thread_id=F("session__key")
        )
    if checkpoint_ns is not None:
        qs = qs.filter(checkpoint_ns=checkpoint_ns)
    if checkpoint_id is not None:
        qs = qs.filter(checkpoint_id=checkpoint_id)
    if before is not None:
        qs = qs.filter(checkpoint_id__lt=before)
    qs = _metadata_matches(qs, metadata or {})
    qs = qs.order_by("-checkpoint_id", "checkpoint_ns")
    if limit is not None:
        qs = qs[:limit]
    return _loaded(list(qs))


def iter_query(
    thread_sessions: QuerySet, *, page: int = 100, **filters: Any
) -> Iterator[StoredCheckpoint]:
    """``query`` in pages of ``page`` (memory does not grow with the thread's length)."""
    limit = filters.pop("limit", None)
    before = filters.pop("before", None)
    served = 0
    while limit is None or served < limit:
        size = page if limit is None else min(page, limit - served)
        batch = query(thread_sessions, before=before, limit=size, **filters)
        yield from batch
        served += len(batch)
        if len(batch) < size:
            return
        before = batch[-1].checkpoint_id


# ---- deleting and copying ------------------------------------------------------------------------
def delete(session_ids: Iterable[uuid.UUID]) -> int:
    """Delete every checkpoint, value and write of these sessions (the sessions stay)."""
    ids = list(session_ids)
    if not ids:
        return 0
    using = _write_db()
    with transaction.atomic(using=using):
        CheckpointWrite.objects.filter(session_id__in=ids)._raw_delete(using)
        CheckpointBlob.objects.filter(session_id__in=ids)._raw_delete(using)
        return Checkpoint.objects.filter(session_id__in=ids)._raw_delete(using)


def _drop_unreferenced_values(session_id: uuid.UUID) -> None:
    """Delete the channel values of a session no stored checkpoint names any more."""
    named = set()
    for ns, checkpoint in Checkpoint.objects.filter(session_id=session_id).values_list(
        "checkpoint_ns", "checkpoint"
    ):
        for channel, version in (checkpoint.get("channel_versions") or {}).items():
            named.add((ns, channel, str(version)))
    doomed = [
        pk
        for pk, ns, channel, version in CheckpointBlob.objects.filter(
            session_id=session_id
        ).values_list("pk", "checkpoint_ns", "channel", "version")
        if (ns, channel, version) not in named
    ]
    for start in range(0, len(doomed), CHUNK):
        CheckpointBlob.objects.filter(pk__in=doomed[start : start + CHUNK]).delete()


def _delete_checkpoints(session_id: uuid.UUID, doomed: list[tuple[str, str]]) -> int:
    """Delete these ``(checkpoint_ns, checkpoint_id)`` of a session with their writes."""
    for start in range(0, len(doomed), CHUNK):
        chunk = doomed[start : start + CHUNK]
        which = Q()
        for ns, cid in chunk:
            which |= Q(checkpoint_ns=ns, checkpoint_id=cid)
        CheckpointWrite.objects.filter(which, session_id=session_id).delete()
        Checkpoint.objects.filter(which, session_id=session_id).delete()
    return len(doomed)


def delete_for_runs(thread_sessions: QuerySet, run_ids: Sequence[str]) -> int:
    """Delete the checkpoints the given runs wrote (with their writes and the values no other
    checkpoint names); returns how many checkpoints went."""
    if not run_ids:
        return 0
    with transaction.atomic(using=_write_db()):
        found: dict[uuid.UUID, list[tuple[str, str]]] = {}
        for session_id, ns, cid in Checkpoint.objects.filter(
            session__in=thread_sessions, run_id__in=list(run_ids)
        ).values_list("session_id", "checkpoint_ns", "checkpoint_id"):
            found.setdefault(session_id, []).append((ns, cid))
        removed = 0
        for session_id, doomed in found.items():
            removed += _delete_checkpoints(session_id, doomed)
            _drop_unreferenced_values(session_id)
        return removed


def prune(session_ids: Iterable[uuid.UUID], *, keep: int) -> int:
    """Keep the newest ``keep`` checkpoints of each namespace of each session (with their writes
    and values) and delete the rest; returns how many checkpoints went."""
    removed = 0
    for session_id in session_ids:
        with transaction.atomic(using=_write_db()):
            # The thread's row lock: a put in flight lands before or after the prune, whole.
            sessions.lock(session_id)
            if keep == 0:
                removed += Checkpoint.objects.filter(session_id=session_id).count()
                delete([session_id])
                continue
            kept: dict[str, int] = {}
            doomed = []
            for ns, cid in (
                Checkpoint.objects.filter(session_id=session_id)
                .order_by("checkpoint_ns", "-checkpoint_id")
                .values_list("checkpoint_ns", "checkpoint_id")
                .iterator(chunk_size=CHUNK)
            ):
                kept[ns] = kept.get(ns, 0) + 1
                if kept[ns] > keep:
                    doomed.append((ns, cid))
            if doomed:
                removed += _delete_checkpoints(session_id, doomed)
                _drop_unreferenced_values(session_id)
    return removed


def copy(source_id: uuid.UUID, target_id: uuid.UUID) -> int:
    """Copy every checkpoint, value and write of one session into another; returns how many
    checkpoints were copied (what the target already holds under the same ids is kept)."""
    copied = 0
    with transaction.atomic(using=_write_db()):
        for model in (CheckpointBlob, CheckpointWrite, Checkpoint):
            batch = []
            for row in model.objects.filter(session_id=source_id).iterator(chunk_size=CHUNK):
                row.pk = None
                row.session_id = target_id
                batch.append(row)
                if len(batch) >= CHUNK:
                    model.objects.bulk_create(batch, ignore_conflicts=True)
                    copied += len(batch) if model is Checkpoint else 0
                    batch = []
            if batch:
                model.objects.bulk_create(batch, ignore_conflicts=True)
                copied += len(batch) if model is Checkpoint else 0
        _touch(target_id)
    return copied
