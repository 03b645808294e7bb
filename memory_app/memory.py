"""The facade agent code imports: ``Memory`` opens sessions, ``SessionMemory`` is one of them.

    from memory_app import Memory

    mem = Memory.session("chat-42", owner=request.user, namespace="support-bot")
    mem.add({"role": "user", "content": "Hi"})
    reply = client.chat.completions.create(model=..., messages=mem.window(max_tokens=8000).messages)

It only composes the layers below (``store``: the log, snapshots, sessions, import/export;
``services``: windows, recall, compaction, background work, owners), which hold the rules. Every
method has an async twin prefixed with ``a`` (``aadd``, ``awindow``, ...), declared next to it;
the twin of a write, when its task is cancelled, waits for the write's outcome before it raises
``CancelledError``, so "cancelled" never hides a write that landed afterwards.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async

from .aio import static_twin, twin
from .conf import memory_settings
from .learned import OwnerMemory
from .models import Session
from .providers.summarizers import Summarizer
from .services import background, compaction, embedding, owners, recall, windows
from .services import blocks as memory_blocks
from .store import async_log, log, reads, sessions, snapshots, transfer
from .types import (
    ANY_OWNER,
    ErasedRows,
    MemoryBlock,
    RecallWindow,
    Scheduled,
    SearchResult,
    SessionInfo,
    SnapshotView,
    StoredMessage,
    Window,
)
from .validation import MAX_CURSOR, MAX_IMPORTED_CURSOR, check_cursor, check_snapshot

__all__ = ["ANY_OWNER", "MAX_CURSOR", "MAX_IMPORTED_CURSOR", "Memory", "SessionMemory"]


class Memory:
    """Entry points: open, list and import sessions; one owner's export and erase."""

    @staticmethod
    def session(
        key: str,
        *,
        owner=None,
        namespace: str | None = None,
        create: bool = True,
        title: str | None = None,
        metadata: dict | None = None,
        expires_at: dt.datetime | None = None,
    ) -> SessionMemory:
        """The session ``key`` of ``owner`` in ``namespace``; created when missing unless
        ``create=False``."""
        return SessionMemory(
            sessions.get_or_create(
                key,
                owner=owner,
                namespace=namespace,
                create_missing=create,
                title=title,
                metadata=metadata,
                expires_at=expires_at,
            )
        )

    @staticmethod
    def create(
        key: str,
        *,
        owner=None,
        namespace: str | None = None,
        title: str = "",
        metadata: dict | None = None,
        expires_at: dt.datetime | None = None,
    ) -> SessionMemory:
        """A new session; raises ``SessionExists`` if the key is taken."""
        return SessionMemory(
            sessions.create(
                owner=owner,
                namespace=namespace,
                key=key,
                title=title,
                metadata=metadata,
                expires_at=expires_at,
            )
        )

    @staticmethod
    def get(session_id: uuid.UUID | str, *, owner=None) -> SessionMemory:
        """The session with this id, if ``owner`` may see it; else ``SessionNotFound``."""
        return SessionMemory(sessions.get(session_id, owner=owner))

    @staticmethod
    def add(session_id: uuid.UUID | str, message: dict[str, Any], *, owner=None) -> StoredMessage:
        """Append one message to the session with this id, if ``owner`` may see it (else
        ``SessionNotFound``): ``get(...).add(...)`` in one statement, for callers that hold
        only the id (the REST API)."""
        return log.add(session_id, message, owner=owner)

    @staticmethod
    def add_many(
        session_id: uuid.UUID | str, messages: Iterable[dict[str, Any]], *, owner=None
    ) -> list[StoredMessage]:
        """``add()`` for a batch: all stored, in order, with consecutive cursors, or none."""
        return log.add_many(session_id, messages, owner=owner)

    @staticmethod
    def sessions(owner=None, namespace: str | None = None) -> list[SessionInfo]:
        """The owner's sessions, newest first, with title, counts and whether they hold a
        snapshot."""
        return [sessions.session_info(s) for s in sessions.list_queryset(owner, namespace)]

    @staticmethod
    def sessions_queryset(owner=None, namespace: str | None = None):
        """``sessions()`` as an unevaluated QuerySet (rows annotated with ``has_snapshot``), for
        list views that filter, order and paginate in the database."""
        return sessions.list_queryset(owner, namespace)

    @staticmethod
    def import_session(
        data: dict,
        *,
        owner: Any = transfer.FROM_EXPORT,
        namespace: str | None = None,
        key: str | None = None,
    ) -> SessionMemory:
        """Restore an ``export()`` losslessly (same cursors, snapshots, metadata) as a new session
        of ``owner`` (default: the owner the export names), checked exactly as an append is.
        Its messages are embedded in the background once the import commits, as appended ones
        are, so they are searchable without a ``memory_embed`` run."""
        return SessionMemory(
            transfer.import_session(data, owner=owner, namespace=namespace, key=key)
        )

    @staticmethod
    def export_owner(owner) -> dict[str, Any]:
        """Every session of ``owner``; each element of ``sessions`` restores with
        ``import_session``."""
        return owners.export_owner(owner)

    @staticmethod
    def iter_owner_export(
        owner, *, batch_size: int = 1000, progress: Callable[[int], None] | None = None
    ) -> Iterator[str]:
        """``export_owner`` as JSON text in pieces, ``batch_size`` messages at a time."""
        return owners.iter_owner_export(owner, batch_size=batch_size, progress=progress)

    @staticmethod
    def erase_owner(owner, *, progress: Callable[[str, int], None] | None = None) -> ErasedRows:
        """Delete every session of ``owner`` with everything under it, in one transaction."""
        return owners.erase_owner(owner, progress=progress)

    @staticmethod
    def learned(owner) -> OwnerMemory:
        """What was learned about ``owner``: facts with provenance and time, memory blocks."""
        return OwnerMemory(owner)

    asession = static_twin(session, write=True)
    acreate = static_twin(create, write=True)
    aget = static_twin(get)

    @staticmethod
    async def aadd(
        session_id: uuid.UUID | str, message: dict[str, Any], *, owner=None
    ) -> StoredMessage:
        """``add()`` for async callers: natively on PostgreSQL (``store.async_log``)."""
        return await async_log.aadd(session_id, message, owner=owner)

    @staticmethod
    async def aadd_many(
        session_id: uuid.UUID | str, messages: Iterable[dict[str, Any]], *, owner=None
    ) -> list[StoredMessage]:
        return await async_log.aadd_many(session_id, messages, owner=owner)

    asessions = static_twin(sessions)
    aimport_session = static_twin(import_session, write=True)


class SessionMemory:
    """A handle on one session. Cheap to create; every read goes to the database."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def __repr__(self) -> str:
        return f"<SessionMemory {self.session.namespace}/{self.session.key} {self.session.pk}>"

    @property
    def id(self) -> uuid.UUID:
        return self.session.pk

    @property
    def key(self) -> str:
        return self.session.key

    @property
    def namespace(self) -> str:
        return self.session.namespace

    @property
    def owner_id(self):
        return self.session.owner_id

    @property
    def learned(self) -> OwnerMemory:
        """What was learned about the session's owner (facts this session teaches name it as
        their source) and the memory blocks its windows carry."""
        return OwnerMemory(self.session.owner_id, session_id=self.id)

    def blocks(self) -> list[MemoryBlock]:
        """The memory blocks this session's windows carry: its owner's, then its own."""
        return memory_blocks.for_session(self.session.owner_id, self.id)

    def extract_memories(self) -> dict | None:
        """Learn from this session's waiting messages now, with ``MEMORY_EXTRACTOR``; the counts
        of what was read, added, updated and confirmed (``None`` without an extractor)."""
        return background.run_extraction(self.id)

    def info(self) -> SessionInfo:
        """The session as ``Memory.sessions()`` lists it, read afresh."""
        return sessions.info(self.id)

    def refresh(self) -> SessionMemory:
        self.session = sessions.get(self.id, owner=ANY_OWNER)
        return self

    # -- the log ---------------------------------------------------------------------------
    def add(self, message: dict[str, Any]) -> StoredMessage:
        """Validate and append one OpenAI-format message; returns it with its cursor."""
        return log.add(self.id, message)

    def add_many(self, messages: Iterable[dict[str, Any]]) -> list[StoredMessage]:
        """Append a batch atomically: all stored, in order, with consecutive cursors, or none."""
        return log.add_many(self.id, messages)

    def messages(
        self, after: int | None = None, limit: int | None = None, *, before: int | None = None
    ) -> list[StoredMessage]:
        """Messages after cursor ``after`` (and before ``before``), oldest first; with only
        ``before`` and ``limit``, the last ``limit`` before it (paging backwards)."""
        return reads.messages(self.id, after, limit, before=before)

    def last(self, n: int) -> list[StoredMessage]:
        """The newest ``n`` messages, oldest first."""
        return reads.last(self.id, n)

    def get_message(self, cursor: int) -> StoredMessage:
        return reads.get(self.id, cursor)

    def cursor_range(self) -> tuple[int, int] | None:
        """``(first, last)`` cursor of the messages stored now, or ``None`` when there are none."""
        return reads.cursor_range(self.id)

    def count(self) -> int:
        """Messages stored now (the stored counter: no scan)."""
        return sessions.field(self.id, "message_count")

    def pop_last(self) -> StoredMessage | None:
        """Delete the newest message and return it (``None`` when empty); its cursor is never
        reused."""
        return log.pop_last(self.id)

    async def aadd(self, message: dict[str, Any]) -> StoredMessage:
        """``add()`` for async callers: natively on PostgreSQL (``store.async_log``)."""
        return await async_log.aadd(self.id, message)

    async def aadd_many(self, messages: Iterable[dict[str, Any]]) -> list[StoredMessage]:
        return await async_log.aadd_many(self.id, messages)

    amessages = twin(messages)
    alast = twin(last)
    aget_message = twin(get_message)
    acursor_range = twin(cursor_range)
    acount = twin(count)
    apop_last = twin(pop_last, write=True)

    # -- windows and recall ----------------------------------------------------------------
    def window(
        self,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        *,
        model: str | None = None,
    ) -> Window:
        """What to send the model next: snapshot summary and pinned messages, system messages,
        then the newest whole tool groups that fit ``max_messages`` / ``max_tokens``."""
        return windows.window(self.id, max_messages, max_tokens, model=model)

    def search(
        self,
        query: str,
        limit: int = 5,
        *,
        scope: str = "session",
        roles: Iterable[str] | None = None,
        mode: str | None = None,
        filters: dict | None = None,
    ) -> list[SearchResult]:
        """Messages matching ``query``, best first; ``scope`` ``"session"`` or ``"owner"``,
        ``mode`` ``"hybrid"``, ``"vector"`` or ``"fulltext"`` (see ``services.recall``);
        ``filters``: ``{"metadata": {...}, "created_after", "created_before", "namespace",
        "session"}`` (``validation.RecallFilters``)."""
        return recall.search(
            self.session, query, limit=limit, scope=scope, roles=roles, mode=mode, filters=filters
        )

    def context(
        self,
        query: str | None,
        max_tokens: int | None = None,
        recall_k: int = 5,
        *,
        max_messages: int | None = None,
        model: str | None = None,
        scope: str = "session",
        mode: str | None = None,
        roles: Iterable[str] | None = None,
        memories: int = 0,
        filters: dict | None = None,
    ) -> RecallWindow:
        """``window()`` plus up to ``recall_k`` older messages relevant to ``query`` and up to
        ``memories`` of the owner's current facts, in ONE system message labelled as untrusted
        reference data with their sources; everything fits ``max_tokens``."""
        return recall.recall_context(
            self.session,
            query,
            max_tokens=max_tokens,
            recall_k=recall_k,
            max_messages=max_messages,
            model=model,
            scope=scope,
            mode=mode,
            roles=roles,
            memories=memories,
            filters=filters,
        )

    def embed(self, *, reembed: bool = False, cursors: Iterable[int] | None = None) -> int:
        """Embed the messages without a vector from the configured embedder (all again with
        ``reembed``; only ``cursors`` when given); returns how many vectors were stored."""
        if cursors is not None:
            cursors = [check_cursor(c) for c in cursors]
        return background.run_embedding(self.id, cursors=cursors, reembed=reembed)

    def schedule_reembedding(self) -> Scheduled:
        """Embed the whole session again in the background (inline without a broker)."""
        return background.schedule_embedding(self.id, reembed=True)

    awindow = twin(window)
    asearch = twin(search)
    acontext = twin(context)
    aembed = twin(embed, write=True)
    aextract_memories = twin(extract_memories, write=True)

    # -- snapshots and compaction ----------------------------------------------------------
    def latest_snapshot(self) -> SnapshotView | None:
        return snapshots.latest(self.id)

    def snapshots(self, newest: int | None = None) -> list[SnapshotView]:
        """Every snapshot version, oldest first (the lineage); only the latest ``newest`` if
        given."""
        return snapshots.lineage(self.id, newest)

    def snapshot_ranges(self) -> list[tuple[int, int]]:
        """``(version, upto)`` of every snapshot, oldest first."""
        return snapshots.ranges(self.id)

    def load_snapshot(self) -> tuple[SnapshotView | None, list[StoredMessage]]:
        """``(latest snapshot or None, the messages after it)``: the state a summarizer starts
        from."""
        return compaction.load(self.id)

    def save_snapshot(
        self,
        summary: str,
        *,
        upto: int,
        prev: SnapshotView | int | None = None,
        pinned: Iterable[dict | StoredMessage] = (),
        model: str = "",
        metadata: dict | None = None,
        prune: bool | None = None,
    ) -> SnapshotView:
        """Save a summary standing for every message up to cursor ``upto``, by compare-and-swap.

        ``prev`` is the snapshot (or its version) the caller read; if another was saved since,
        ``SnapshotConflict`` is raised and nothing is written. With ``prune`` (default: the
        ``PRUNE_COMPACTED`` setting) covered messages are deleted, except remembered and system
        ones; cursors of the rest never change.
        """
        new = check_snapshot(
            summary, upto=upto, prev=prev, pinned=pinned, model=model, metadata=metadata
        )
        prune = memory_settings.PRUNE_COMPACTED if prune is None else bool(prune)
        if prune:
            embedding.promote_before_pruning(self.id, new.upto)
        return snapshots.save(self.id, new, prune=prune)

    def prune_compacted(self) -> int:
        """Delete the messages the latest snapshot stands for (not remembered ones); returns how
        many. Their embeddings stay (embedded first when missing): recall still finds them."""
        embedding.promote_before_pruning(self.id, snapshots.latest_upto(self.id))
        return snapshots.prune_covered(self.id)

    def compact(
        self,
        keep_recent: int | None = None,
        summarizer: Summarizer | None = None,
        *,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
    ) -> SnapshotView | None:
        """Fold all but the newest ``keep_recent`` messages into the summary, by compare-and-swap
        (see ``services.compaction``); ``None`` when there was nothing to cover."""
        return compaction.compact(
            self.id,
            keep_recent=keep_recent,
            summarizer=summarizer,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
        )

    def schedule_summary(self, keep_recent: int | None = None) -> Scheduled:
        """Summarize in the background (inline without a broker), unless a run is already
        queued or running; says what happened (queued, ran, pending or failed)."""
        return background.schedule_summary(self.id, keep_recent=keep_recent)

    def summarize_async(self, keep_recent: int | None = None) -> str | None:
        """``schedule_summary()``'s task id (``None`` when nothing was scheduled)."""
        return self.schedule_summary(keep_recent).task_id

    alatest_snapshot = twin(latest_snapshot)
    asnapshots = twin(snapshots)
    aload_snapshot = twin(load_snapshot)
    asave_snapshot = twin(save_snapshot, write=True)
    aprune_compacted = twin(prune_compacted, write=True)
    acompact = twin(compact, write=True)
    aschedule_summary = twin(schedule_summary, write=True)
    asummarize_async = twin(summarize_async, write=True)

    # -- title and metadata ----------------------------------------------------------------
    @property
    def title(self) -> str:
        return sessions.field(self.id, "title")

    def set_title(self, title: str) -> None:
        sessions.update(self.id, title=title)
        self.session.title = title

    @property
    def meta(self) -> dict:
        return sessions.field(self.id, "metadata")

    def set_meta(self, key: str, value: Any) -> dict:
        """Set one metadata key (an empty value removes it); returns the new metadata."""
        self.session.metadata = sessions.set_meta(self.id, key, value)
        return self.session.metadata

    def update(
        self,
        *,
        title: str | None = None,
        metadata: dict | None = None,
        expires_at: dt.datetime | None | Any = ...,
    ) -> None:
        """Replace title, metadata and/or expiry (the fields a client may edit)."""
        sessions.update(self.id, title=title, metadata=metadata, expires_at=expires_at)
        self.refresh()

    async def ameta(self) -> dict:
        return await sync_to_async(sessions.field)(self.id, "metadata")

    aset_title = twin(set_title, write=True)
    aset_meta = twin(set_meta, write=True)
    aupdate = twin(update, write=True)

    # -- whole session ---------------------------------------------------------------------
    def clear(self) -> None:
        """Remove messages, snapshots, embeddings and metadata; cursors are never reused."""
        sessions.clear(self.id)
        self.refresh()

    def delete(self) -> None:
        """Delete the session with its messages, snapshots and embeddings (no-op if gone)."""
        sessions.delete(self.id)

    def export(self) -> dict[str, Any]:
        """The whole session as JSON-serialisable data; ``Memory.import_session`` restores it."""
        self.refresh()
        return transfer.export_session(self.id)

    aclear = twin(clear, write=True)
    adelete = twin(delete, write=True)
    aexport = twin(export)
