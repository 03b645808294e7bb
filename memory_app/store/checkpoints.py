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

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from typing import Any

from django.db import connections, router, transaction
from django.db.models import CharField, F, Q, QuerySet, Value
from django.utils import timezone

from ..encryption import decrypt_bytes, encrypt_bytes
from ..models import Checkpoint, CheckpointBlob, CheckpointWrite, Session
from ..types import ANY_OWNER, StoredCheckpoint
from . import policies, sessions, statements

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
    owner: Any,
    namespace: str,
    thread_id: str,
    *,
    checkpoint_ns: str,
    checkpoint: dict,
    metadata: dict,
    run_id: str,
    parent_checkpoint_id: str,
    values: Iterable[tuple[str, str, str, bytes | None]],
) -> None:
    """Store a checkpoint (``checkpoint["id"]``) of thread ``thread_id`` (the session is created
    when missing) and the channel values new in it, given as ``(channel, version, type,
    bytes)``; a value already stored for that version is kept."""
    values = list(values)
    namespace = sessions.namespace_or_default(namespace)
    connection = connections[_write_db()]
    if _by_statement(connection, owner):
        _in_thread(
            connection,
            owner,
            namespace,
            thread_id,
            _put_statement,
            {
                "ns": checkpoint_ns,
                "channels": [channel for channel, _, _, _ in values],
                "versions": [version for _, version, _, _ in values],
                "types": [kind for _, _, kind, _ in values],
                "blobs": [encrypt_bytes(data) for _, _, _, data in values],
                "id": checkpoint["id"],
                "parent": parent_checkpoint_id,
                "run": run_id,
                # As the model's JSONField writes them (json.dumps, the default encoder).
                "checkpoint": json.dumps(checkpoint),
                "metadata": json.dumps(metadata),
                "now": timezone.now(),
                "ttls": policies.sliding_ttls(),  # the sliding expiry, as an append applies it
            },
        )
        return
    session_id = thread_session(owner, namespace, thread_id, create=True)
    with transaction.atomic(using=connection.alias):
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


@cache
def _put_statement(ownerless: bool) -> str:
    """The thread's session found by its key, then the values, the checkpoint and the session's
    ``updated_at`` in one statement: one round trip instead of six (a single statement is
    atomic without a transaction of its own). No row back: the thread has no session yet."""
    blob, checkpoint, session = (
        CheckpointBlob._meta.db_table,
        Checkpoint._meta.db_table,
        Session._meta.db_table,
    )
    return f"""
        WITH {_thread_sql(ownerless)}, new_values AS (
            INSERT INTO {blob} (session_id, checkpoint_ns, channel, version, type, blob)
            SELECT thread.id, %(ns)s, v.channel, v.version, v.type, v.blob
            FROM thread, unnest(%(channels)s::text[], %(versions)s::text[], %(types)s::text[],
                                %(blobs)s::bytea[]) AS v(channel, version, type, blob)
            ON CONFLICT (session_id, checkpoint_ns, channel, version) DO NOTHING
        ), saved AS (
            INSERT INTO {checkpoint} (session_id, checkpoint_ns, checkpoint_id,
                parent_checkpoint_id, run_id, checkpoint, metadata, created_at)
            SELECT thread.id, %(ns)s, %(id)s, %(parent)s, %(run)s, %(checkpoint)s::jsonb,
                   %(metadata)s::jsonb, %(now)s
            FROM thread
            ON CONFLICT (session_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
                parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, run_id = EXCLUDED.run_id,
                checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
        )
        UPDATE {session} SET updated_at = %(now)s, {policies.SLIDING_EXPIRY_SQL}
        WHERE id = (SELECT id FROM thread) RETURNING id"""


def _by_statement(connection, owner: Any) -> bool:
    """Whether a call on one thread goes as one statement that finds the thread itself
    (PostgreSQL, one owner's threads), not through the ORM."""
    return connection.vendor == "postgresql" and sessions.owner_id(owner) is not ANY_OWNER


def _thread_sql(ownerless: bool) -> str:
    """The ``thread`` CTE the one-statement calls start with: the thread's session, by key."""
    owner = "owner_id IS NULL" if ownerless else "owner_id = %(owner)s"
    return f"""thread AS (
            SELECT id FROM {Session._meta.db_table}
            WHERE {owner} AND namespace = %(namespace)s AND key = %(key)s
        )"""


def _in_thread(connection, owner, namespace, thread_id, statement, params: dict) -> None:
    """Run ``statement(ownerless)``, which writes only when the thread's session exists and
    then returns a row. A new thread's session is created by the rule book, then it runs again."""
    owner = sessions.owner_id(owner)
    params = {**params, "owner": owner, "namespace": namespace, "key": thread_id}
    sql = statement(owner is None)
    if statements.execute(connection, sql, params):
        return
    thread_session(owner, namespace, thread_id, create=True)
    if not statements.execute(connection, sql, params):
        raise Session.DoesNotExist(f"thread {thread_id!r} was deleted while it was written")


def put_writes(
    owner: Any,
    namespace: str,
    thread_id: str,
    *,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: Sequence[tuple[int, str, str, bytes | None]],
    replace: bool,
) -> None:
    """Store a task's writes ``(idx, channel, type, bytes)`` for a checkpoint of thread
    ``thread_id`` (the session is created when missing). A write already stored under the same
    (task, idx) is kept, or replaced when ``replace`` (special channels: the latest error or
    interrupt of a task is the one that counts)."""
    namespace = sessions.namespace_or_default(namespace)
    connection = connections[_write_db()]
    if _by_statement(connection, owner):
        _in_thread(
            connection,
            owner,
            namespace,
            thread_id,
            _replace_writes_statement if replace else _keep_writes_statement,
            {
                "ns": checkpoint_ns,
                "checkpoint": checkpoint_id,
                "task": task_id,
                "path": task_path,
                "idxs": [idx for idx, _, _, _ in writes],
                "channels": [channel for _, channel, _, _ in writes],
                "types": [kind for _, _, kind, _ in writes],
                "blobs": [encrypt_bytes(data) for _, _, _, data in writes],
            },
        )
        return
    session_id = thread_session(owner, namespace, thread_id, create=True)
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


def _writes_statement(ownerless: bool, on_conflict: str) -> str:
    """A task's writes inserted in the thread found by key, in one statement."""
    return f"""
        WITH {_thread_sql(ownerless)}, written AS (
            INSERT INTO {CheckpointWrite._meta.db_table} (session_id, checkpoint_ns,
                checkpoint_id, task_id, task_path, idx, channel, type, blob)
            SELECT thread.id, %(ns)s, %(checkpoint)s, %(task)s, %(path)s, w.idx, w.channel,
                   w.type, w.blob
            FROM thread, unnest(%(idxs)s::integer[], %(channels)s::text[], %(types)s::text[],
                                %(blobs)s::bytea[]) AS w(idx, channel, type, blob)
            ON CONFLICT (session_id, checkpoint_ns, checkpoint_id, task_id, idx) {on_conflict}
        )
        SELECT id FROM thread"""


@cache
def _keep_writes_statement(ownerless: bool) -> str:
    return _writes_statement(ownerless, "DO NOTHING")


@cache
def _replace_writes_statement(ownerless: bool) -> str:
    return _writes_statement(
        ownerless,
        "DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, "
        "blob = EXCLUDED.blob, task_path = EXCLUDED.task_path",
    )


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


def get(
    owner: Any, namespace: str, thread_id: str, *, checkpoint_ns: str, checkpoint_id: str | None
) -> StoredCheckpoint | None:
    """One checkpoint of thread ``thread_id`` (the newest of the namespace when no id is given)
    with its values and pending writes; ``None`` when there is none."""
    found = query_thread(
        owner,
        namespace,
        thread_id,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        limit=1,
    )
    return found[0] if found else None


def query_thread(
    owner: Any,
    namespace: str,
    thread_id: str,
    *,
    checkpoint_ns: str | None = None,
    checkpoint_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    before: str | None = None,
    limit: int | None = None,
) -> list[StoredCheckpoint]:
    """``query`` on one thread of ``owner`` in ``namespace``: on PostgreSQL in one statement
    (the session found by key, the checkpoints, their values and writes), else the ORM's four
    queries."""
    namespace = sessions.namespace_or_default(namespace)
    connection = connections[router.db_for_read(Checkpoint)]
    if not _by_statement(connection, owner):
        return query(
            threads(owner, namespace),
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            metadata=metadata,
            before=before,
            limit=limit,
        )
    owner = sessions.owner_id(owner)
    params = {"owner": owner, "namespace": namespace, "key": thread_id, "ns": checkpoint_ns,
              "id": checkpoint_id, "before": before, "limit": limit,
              "metadata": json.dumps(metadata) if metadata else None}  # fmt: skip
    sql = _read_statement(owner is None, *(params[name] is not None for name in _READ_FILTERS))
    return [_read_row(thread_id, row) for row in statements.execute(connection, sql, params)]


def iter_query_thread(
    owner: Any, namespace: str, thread_id: str, *, page: int = 100, **filters: Any
) -> Iterator[StoredCheckpoint]:
    """``query_thread`` in pages of ``page`` (memory does not grow with the thread's length)."""
    return _paged(lambda **f: query_thread(owner, namespace, thread_id, **f), page, filters)


def _read_row(thread_id: str, row) -> StoredCheckpoint:
    (session_id, ns, checkpoint_id, parent_id, checkpoint, metadata, created_at,
     channels, types, blobs, tasks, write_channels, write_types, write_blobs) = row  # fmt: skip
    return StoredCheckpoint(
        session_id=session_id,
        thread_id=thread_id,
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent_id,
        checkpoint=checkpoint,
        metadata=metadata,
        values={
            channel: (kind, decrypt_bytes(blob) or b"")
            for channel, kind, blob in zip(channels or (), types or (), blobs or (), strict=True)
        },
        writes=[
            (task, channel, kind, decrypt_bytes(blob) or b"")
            for task, channel, kind, blob in zip(
                tasks or (), write_channels or (), write_types or (), write_blobs or (), strict=True
            )
        ],
        created_at=created_at,
    )


#: The optional filters of ``_read_statement``, in its arguments' order.
_READ_FILTERS = ("ns", "id", "metadata", "before", "limit")


@cache
def _read_statement(
    ownerless: bool, ns: bool, checkpoint_id: bool, metadata: bool, before: bool, limit: bool
) -> str:
    """Checkpoints of the thread found by key, newest first, each with the values its channel
    versions name and its writes in replay order: one statement (four queries through the
    ORM), its text fixed per set of filters so that each keeps an index-friendly plan.
    Versions match as ``put`` stores them: the version's text (ints and strings, as LangGraph
    makes them, read the same from the checkpoint's JSON)."""
    checkpoint, blob, write = (
        Checkpoint._meta.db_table,
        CheckpointBlob._meta.db_table,
        CheckpointWrite._meta.db_table,
    )
    where = [
        condition
        for wanted, condition in (
            (ns, "c.checkpoint_ns = %(ns)s"),
            (checkpoint_id, "c.checkpoint_id = %(id)s"),
            (metadata, "c.metadata @> %(metadata)s::jsonb"),
            (before, "c.checkpoint_id < %(before)s"),
        )
        if wanted
    ]
    return f"""
        WITH {_thread_sql(ownerless)}, found AS (
            SELECT c.session_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
                   c.checkpoint, c.metadata, c.created_at
            FROM {checkpoint} c
            -- The session first (not a join): then the checkpoint index serves "newest first"
            -- with a limit, where a join has the planner read and sort all of the thread's.
            WHERE c.session_id = (SELECT id FROM thread) {"".join(" AND " + w for w in where)}
            ORDER BY c.checkpoint_id DESC, c.checkpoint_ns
            {"LIMIT %(limit)s" if limit else ""}
        )
        SELECT found.*, v.channels, v.types, v.blobs, w.tasks, w.channels, w.types, w.blobs
        FROM found
        LEFT JOIN LATERAL (
            SELECT array_agg(b.channel) AS channels, array_agg(b.type) AS types,
                   array_agg(b.blob) AS blobs
            FROM jsonb_each_text(found.checkpoint -> 'channel_versions') AS named(channel, version)
            -- Each named version looked up on the unique index (LIMIT 1 keeps the planner from
            -- hash-joining every value of the thread instead).
            CROSS JOIN LATERAL (
                SELECT channel, type, blob FROM {blob}
                WHERE session_id = found.session_id AND checkpoint_ns = found.checkpoint_ns
                  AND channel = named.channel AND version = named.version
                  AND type <> '{EMPTY}'
                LIMIT 1
            ) b
        ) v ON true
        LEFT JOIN LATERAL (
            SELECT array_agg(x.task_id ORDER BY x.task_path, x.task_id, x.idx) AS tasks,
                   array_agg(x.channel ORDER BY x.task_path, x.task_id, x.idx) AS channels,
                   array_agg(x.type ORDER BY x.task_path, x.task_id, x.idx) AS types,
                   array_agg(x.blob ORDER BY x.task_path, x.task_id, x.idx) AS blobs
            FROM {write} x
            WHERE x.session_id = found.session_id AND x.checkpoint_ns = found.checkpoint_ns
              AND x.checkpoint_id = found.checkpoint_id
        ) w ON true
        ORDER BY found.checkpoint_id DESC, found.checkpoint_ns"""


def iter_query(
    thread_sessions: QuerySet, *, page: int = 100, **filters: Any
) -> Iterator[StoredCheckpoint]:
    """``query`` in pages of ``page`` (memory does not grow with the thread's length)."""
    return _paged(lambda **f: query(thread_sessions, **f), page, filters)


def _paged(query_page, page: int, filters: dict[str, Any]) -> Iterator[StoredCheckpoint]:
    filters = dict(filters)
    limit = filters.pop("limit", None)
    before = filters.pop("before", None)
    served = 0
    while limit is None or served < limit:
        size = page if limit is None else min(page, limit - served)
        batch = query_page(before=before, limit=size, **filters)
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
