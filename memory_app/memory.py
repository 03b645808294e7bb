"""The adapter: the one door agent code, API views, admin actions and tasks go through.

    from memory_app import Memory

    mem = Memory.session("chat-42", owner=request.user, namespace="support-bot")
    mem.add({"role": "user", "content": "Hi"})
    reply = client.chat.completions.create(model=..., messages=mem.window(max_tokens=8000).messages)

Every method has an async twin prefixed with ``a`` (``aadd``, ``awindow``, ...).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, router, transaction
from django.db.models import Max, Min, Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import log
from .conf import memory_settings
from .context import assemble_window, page_sizer
from .encryption import encrypt_row
from .exceptions import (
    InvalidCursor,
    InvalidExport,
    InvalidMessage,
    InvalidSession,
    InvalidSnapshot,
    SessionExists,
    SessionNotFound,
    SnapshotConflict,
)
from .models import Message, Session, Snapshot
from .tokens import count_message, encoding_name_for_model
from .types import SessionInfo, SnapshotView, StoredMessage, Window
from .validation import unstorable, validate_message, validate_messages

if TYPE_CHECKING:
    from .owners import ErasedRows
    from .providers.summarizers import Summarizer

if TYPE_CHECKING:
    from .search import RecallWindow, SearchResult

EXPORT_FORMAT = "memory_app.session"
EXPORT_VERSION = 1
#: The largest cursor (PostgreSQL's bigint).
MAX_CURSOR = 2**63 - 1
#: The largest cursor an import may set: the largest integer JSON clients (JavaScript's numbers)
#: hold exactly, and far enough below MAX_CURSOR that appends after an import cannot overflow.
MAX_IMPORTED_CURSOR = 2**53 - 1


class _AnyOwner:
    def __repr__(self) -> str:
        return "ANY_OWNER"


#: Pass as ``owner`` to look across all owners (staff tools, admin). Never the default.
ANY_OWNER: Any = _AnyOwner()


def _owner_id(owner) -> Any:
    if owner is None or owner is ANY_OWNER:
        return owner
    return getattr(owner, "pk", owner)


def _scoped(owner):
    qs = Session.objects.all()
    if owner is ANY_OWNER:
        return qs
    return qs.for_owner(_owner_id(owner))


def _check_cursor(value: Any, name: str = "cursor") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise InvalidCursor(f"{name} must be an integer, not {value!r}", field=name) from None
    if value < 0:
        raise InvalidCursor(f"{name} must not be negative", field=name)
    if value > MAX_CURSOR:
        # Beyond the database's bigint: refuse it here rather than fail in SQL.
        raise InvalidCursor(f"{name} must be at most {MAX_CURSOR}", field=name)
    return value


def _snapshot_view(snapshot: Snapshot | None) -> SnapshotView | None:
    if snapshot is None:
        return None
    return SnapshotView(
        version=snapshot.version, upto=snapshot.upto, summary=snapshot.summary,
        pinned=list(snapshot.pinned or []), model=snapshot.model,
        metadata=dict(snapshot.metadata or {}), created_at=snapshot.created_at,
    )


def _session_info(s: Session) -> SessionInfo:
    return SessionInfo(
        id=s.id, key=s.key, namespace=s.namespace, title=s.title, owner_id=s.owner_id,
        message_count=s.message_count, token_count=s.token_count,
        has_snapshot=s.has_snapshot, created_at=s.created_at, updated_at=s.updated_at,
        expires_at=s.expires_at, metadata=s.metadata,
    )


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def export_session_fields(s: Session) -> dict[str, Any]:
    """The ``session`` part of an export."""
    return {
        "id": str(s.pk), "key": s.key, "namespace": s.namespace, "title": s.title,
        "metadata": s.metadata, "created_at": _iso(s.created_at),
        "updated_at": _iso(s.updated_at), "expires_at": _iso(s.expires_at),
        "next_seq": s.next_seq,
    }


def export_message(m: StoredMessage) -> dict[str, Any]:
    """A message as an export has it: OpenAI form plus cursor and the store's fields."""
    return {**m.as_openai(), "cursor": m.cursor, "metadata": m.metadata, "tokens": m.tokens,
            "remember": m.remember, "idempotency_key": m.idempotency_key,
            "created_at": _iso(m.created_at)}


def export_snapshot(v: SnapshotView) -> dict[str, Any]:
    """A snapshot as an export has it."""
    return {"version": v.version, "upto": v.upto, "summary": v.summary, "pinned": v.pinned,
            "model": v.model, "metadata": v.metadata, "created_at": _iso(v.created_at)}


class Memory:
    """Entry points: open, list and import sessions."""

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
        """The session ``key`` of ``owner`` in ``namespace``; created when missing unless ``create=False``."""
        namespace = memory_settings.DEFAULT_NAMESPACE if namespace is None else namespace
        _validate_session_fields(key=key, namespace=namespace, title=title, metadata=metadata)
        owner_id = _owner_id(owner)
        lookup = Session.objects.for_owner(owner_id).filter(namespace=namespace, key=key)
        session = lookup.first()
        if session is None:
            if not create:
                raise SessionNotFound(f"no session {key!r} in namespace {namespace!r} for this owner")
            try:
                with transaction.atomic(using=router.db_for_write(Session)):
                    session = Session.objects.create(
                        owner_id=owner_id, namespace=namespace, key=key, title=title or "",
                        metadata=metadata or {}, expires_at=expires_at,
                    )
            except IntegrityError:
                session = lookup.get()  # created concurrently: use that one
        return SessionMemory(session)

    @staticmethod
    def create(key: str, *, owner=None, namespace: str | None = None, title: str = "",
               metadata: dict | None = None, expires_at: dt.datetime | None = None) -> SessionMemory:
        """A new session; raises ``SessionExists`` if the key is taken."""
        namespace = memory_settings.DEFAULT_NAMESPACE if namespace is None else namespace
        _validate_session_fields(key=key, namespace=namespace, title=title, metadata=metadata)
        try:
            with transaction.atomic(using=router.db_for_write(Session)):
                session = Session.objects.create(
                    owner_id=_owner_id(owner), namespace=namespace, key=key, title=title or "",
                    metadata=metadata or {}, expires_at=expires_at,
                )
        except IntegrityError:
            raise SessionExists(f"session {key!r} already exists in namespace {namespace!r}") from None
        return SessionMemory(session)

    @staticmethod
    def get(session_id: uuid.UUID | str, *, owner=None) -> SessionMemory:
        """The session with this id, if ``owner`` may see it; else ``SessionNotFound``."""
        try:
            session = _scoped(owner).get(pk=session_id)
        except (Session.DoesNotExist, ValueError, TypeError):
            raise SessionNotFound(f"no session {session_id}") from None
        except Exception as err:  # malformed UUIDs raise ValidationError
            if err.__class__.__name__ == "ValidationError":
                raise SessionNotFound(f"no session {session_id}") from None
            raise
        return SessionMemory(session)

    @staticmethod
    def sessions(owner=None, namespace: str | None = None) -> list[SessionInfo]:
        """The owner's sessions, newest first, with title, counts and whether they hold a snapshot."""
        return [_session_info(s) for s in Memory.sessions_queryset(owner, namespace)]

    @staticmethod
    def sessions_queryset(owner=None, namespace: str | None = None):
        """``sessions()`` as an unevaluated QuerySet (rows annotated with ``has_snapshot``), for
        list views that filter, order and paginate in the database."""
        qs = _scoped(owner).with_snapshot_flag().order_by("-updated_at")
        if namespace is not None:
            qs = qs.filter(namespace=namespace)
        return qs

    @staticmethod
    def import_session(data: dict, *, owner=None, namespace: str | None = None,
                       key: str | None = None) -> SessionMemory:
        """Restore an ``export()`` losslessly (same cursors, snapshots, metadata) as a new session."""
        return _import_session(data, owner=owner, namespace=namespace, key=key)

    # -- per owner (memory_app.owners) ----------------------------------------------------------
    @staticmethod
    def export_owner(owner) -> dict[str, Any]:
        """Every session of ``owner`` as ``{"format": "memory_app.owner", ..., "sessions":
        [<SessionMemory.export()>, ...]}``; each session restores with ``import_session``."""
        from .owners import export_owner

        return export_owner(owner)

    @staticmethod
    def iter_owner_export(owner, *, batch_size: int = 1000,
                          progress: Callable[[int], None] | None = None) -> Iterator[str]:
        """``export_owner`` as JSON text in pieces, read ``batch_size`` messages at a time
        (for large owners: memory use does not grow with their history)."""
        from .owners import iter_owner_export

        return iter_owner_export(owner, batch_size=batch_size, progress=progress)

    @staticmethod
    def erase_owner(owner, *, progress: Callable[[str, int], None] | None = None) -> ErasedRows:
        """Delete every session of ``owner`` with its messages, snapshots, embeddings and
        metadata, in one transaction; returns the rows removed per table."""
        from .owners import erase_owner

        return erase_owner(owner, progress=progress)


class SessionMemory:
    """A handle on one session. Cheap to create; every read goes to the database."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def __repr__(self) -> str:
        return f"<SessionMemory {self.session.namespace}/{self.session.key} {self.session.pk}>"

    # -- identity -----------------------------------------------------------------------------
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

    def info(self) -> SessionInfo:
        """The session as ``Memory.sessions()`` lists it, read afresh."""
        try:
            return _session_info(Session.objects.with_snapshot_flag().get(pk=self.session.pk))
        except Session.DoesNotExist:
            raise SessionNotFound(f"session {self.session.pk} was deleted") from None

    def refresh(self) -> SessionMemory:
        try:
            self.session.refresh_from_db()
        except Session.DoesNotExist:
            raise SessionNotFound(f"session {self.session.pk} was deleted") from None
        return self

    # -- appending ----------------------------------------------------------------------------
    def add(self, message: dict[str, Any]) -> StoredMessage:
        """Validate and append one OpenAI-format message; returns it with its cursor."""
        return log.append(self.session.pk, [validate_message(message)])[0]

    def add_many(self, messages: Iterable[dict[str, Any]]) -> list[StoredMessage]:
        """Append a batch atomically: all stored, in order, with consecutive cursors, or none."""
        if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
            # Iterable or not, none of these is a batch (a string would become one per character).
            raise InvalidMessage("messages", "must be a list of messages")
        return log.append(self.session.pk, validate_messages(list(messages)))

    # -- reading ------------------------------------------------------------------------------
    def messages(self, after: int | None = None, limit: int | None = None, *,
                 before: int | None = None) -> list[StoredMessage]:
        """Messages with cursor greater than ``after`` (and less than ``before``), oldest first.

        ``limit`` keeps the first ones after ``after``; when only ``before`` is given it keeps
        the last ones before ``before`` instead, which is how a reader pages backwards.
        """
        qs = Message.objects.filter(session_id=self.session.pk)
        if after is not None:
            qs = qs.filter(seq__gt=_check_cursor(after, "after"))
        if before is not None:
            qs = qs.filter(seq__lt=_check_cursor(before, "before"))
        backwards = before is not None and after is None and limit is not None
        qs = qs.order_by("-seq" if backwards else "seq")
        if limit is not None:
            limit = _check_cursor(limit, "limit")
            qs = qs[:limit]
        found = log.rows(qs)
        if backwards:
            found.reverse()
        return found

    def last(self, n: int) -> list[StoredMessage]:
        """The newest ``n`` messages, oldest first."""
        n = _check_cursor(n, "n")
        newest = log.newest(self.session.pk, n)
        newest.reverse()
        return newest

    def cursor_range(self) -> tuple[int, int] | None:
        """``(first, last)`` cursor of the messages stored now, or ``None`` when there are none.

        Two index lookups (min and max of the session's cursors), whatever the session's size.
        """
        bounds = Message.objects.filter(session_id=self.session.pk).aggregate(
            first=Min("seq"), last=Max("seq")
        )
        if bounds["first"] is None:
            return None
        return bounds["first"], bounds["last"]

    def count(self) -> int:
        """Messages stored now (the stored counter: no scan)."""
        return Session.objects.filter(pk=self.session.pk).values_list("message_count", flat=True).get()

    def get_message(self, cursor: int) -> StoredMessage:
        cursor = _check_cursor(cursor)
        found = log.rows(Message.objects.filter(session_id=self.session.pk, seq=cursor))
        if not found:
            raise InvalidCursor(f"no message at cursor {cursor}", field="cursor")
        return found[0]

    # -- context windows ----------------------------------------------------------------------
    def window(self, max_messages: int | None = None, max_tokens: int | None = None,
               *, model: str | None = None) -> Window:
        """What to send the model next: snapshot summary and pinned messages, system messages,
        then the newest whole tool groups that fit ``max_messages`` / ``max_tokens``.

        Tokens are counted for ``model`` (its encoding), by default with ``TOKEN_ENCODING``.
        """
        if max_messages is not None:
            max_messages = _check_cursor(max_messages, "max_messages")
        if max_tokens is not None:
            max_tokens = _check_cursor(max_tokens, "max_tokens")
        encoding = encoding_name_for_model(model)
        sizer = page_sizer(max_messages, max_tokens)
        # Snapshot, system messages (every stored one, covered by the snapshot or not: they
        # are always kept) and the first page of the tail: fixed SQL where possible, with a
        # first page sized from the session's counters when the stored counts are the cost.
        source = log.window_source(
            self.session.pk, page_size=sizer,
            max_tokens=max_tokens if max_messages is None and encoding == memory_settings.TOKEN_ENCODING
            else None,
        )
        if source is not None:
            snapshot, system, newest = source
        else:
            snapshot = self.latest_snapshot()
            system = log.system_messages(self.session.pk)
            newest = log.newest_first(self.session.pk, after=snapshot.upto if snapshot else 0,
                                      page_size=sizer)
        if encoding == memory_settings.TOKEN_ENCODING:
            cost = attrgetter("tokens")  # the count cached at append
        else:
            def cost(m: StoredMessage) -> int:
                return count_message(m.as_openai(), encoding)
        return assemble_window(
            snapshot=snapshot,
            system_messages=system,
            newest_first=newest,
            max_messages=max_messages,
            max_tokens=max_tokens,
            cost=cost,
            cost_of_dict=lambda d: count_message(d, encoding),
        )

    # -- recall (memory_app.search) -----------------------------------------------------------
    def search(self, query: str, limit: int = 5, *, scope: str = "session",
               roles: Iterable[str] | None = None, mode: str | None = None) -> list[SearchResult]:
        """Messages matching ``query``, best first, with score, cursor and session id.

        ``scope``: ``"session"`` (this session, exact) or ``"owner"`` (every session of this
        session's owner, through the HNSW index). ``mode``: ``"hybrid"`` (default setting
        ``SEARCH_MODE``; vector and full-text fused by reciprocal rank fusion), ``"vector"`` or
        ``"fulltext"``. ``roles`` keeps only messages of those roles. Bad arguments raise
        ``InvalidSearch``.
        """
        from .search import search

        return search(self.session, query, limit=limit, scope=scope, roles=roles, mode=mode)

    def context(self, query: str | None, max_tokens: int | None = None, recall_k: int = 5, *,
                max_messages: int | None = None, model: str | None = None,
                scope: str = "session", mode: str | None = None,
                roles: Iterable[str] | None = None) -> RecallWindow:
        """``window()`` plus up to ``recall_k`` older messages relevant to ``query``.

        The recalled messages (not already in the window, deduplicated) come in ONE system
        message labelled as untrusted reference data, never as instructions; everything fits
        ``max_tokens``. See ``memory_app.search.recall_context``.
        """
        from .search import recall_context

        if max_tokens is not None:
            max_tokens = _check_cursor(max_tokens, "max_tokens")
        return recall_context(self, query, max_tokens=max_tokens, recall_k=recall_k,
                              max_messages=max_messages, model=model, scope=scope, mode=mode,
                              roles=roles)

    def embed(self, *, reembed: bool = False, cursors: Iterable[int] | None = None) -> int:
        """Embed this session's messages that have no vector from the configured embedder yet
        (all of them again with ``reembed``; only ``cursors`` when given). Returns how many
        vectors were stored. Usually run by the ``embed_messages`` / ``embed_session`` tasks."""
        from .search import embed_messages

        if cursors is not None:
            cursors = [_check_cursor(c) for c in cursors]
        return embed_messages(session_ids=[self.session.pk], cursors=cursors, replace=reembed)

    async def asearch(self, query: str, limit: int = 5, **kwargs: Any) -> list[SearchResult]:
        return await sync_to_async(self.search)(query, limit, **kwargs)

    async def acontext(self, query: str | None, max_tokens: int | None = None, recall_k: int = 5,
                       **kwargs: Any) -> RecallWindow:
        return await sync_to_async(self.context)(query, max_tokens, recall_k, **kwargs)

    async def aembed(self, **kwargs: Any) -> int:
        return await sync_to_async(self.embed)(**kwargs)

    # -- snapshots ----------------------------------------------------------------------------
    def latest_snapshot(self) -> SnapshotView | None:
        return _snapshot_view(Snapshot.objects.filter(session_id=self.session.pk).order_by("-version").first())

    def snapshots(self, newest: int | None = None) -> list[SnapshotView]:
        """Every snapshot version, oldest first (the lineage); only the latest ``newest`` if given."""
        qs = Snapshot.objects.filter(session_id=self.session.pk)
        if newest is None:
            return [_snapshot_view(s) for s in qs.order_by("version")]
        latest = [_snapshot_view(s) for s in qs.order_by("-version")[:_check_cursor(newest, "newest")]]
        latest.reverse()
        return latest

    def snapshot_ranges(self) -> list[tuple[int, int]]:
        """``(version, upto)`` of every snapshot, oldest first: the lineage without the summaries."""
        return list(
            Snapshot.objects.filter(session_id=self.session.pk).order_by("version").values_list("version", "upto")
        )

    def load_snapshot(self) -> tuple[SnapshotView | None, list[StoredMessage]]:
        """``(latest snapshot or None, the messages after it)``: the state a summarizer starts from."""
        snapshot = self.latest_snapshot()
        return snapshot, self.messages(after=snapshot.upto if snapshot else None)

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
        ``SnapshotConflict`` is raised and nothing is written. ``upto`` must move past ``prev``
        and lie within the log (``InvalidCursor``). With ``prune`` (default: the
        ``PRUNE_COMPACTED`` setting) the covered messages are deleted, except remembered and
        system messages; cursors of the rest never change.
        """
        if not isinstance(summary, str) or not summary.strip():
            raise InvalidSnapshot("summary must be a non-empty string")
        if not isinstance(model, str) or len(model) > 200:
            raise InvalidSnapshot("model must be a string of at most 200 characters")
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidSnapshot("metadata must be an object")
        for name, value in (("summary", summary), ("model", model), ("metadata", metadata)):
            if problem := unstorable(value):
                raise InvalidSnapshot(f"{name} {problem}")
        upto = _check_cursor(upto, "upto")
        expected = prev.version if isinstance(prev, SnapshotView) else prev
        if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
            raise InvalidSnapshot("prev must be a snapshot, its version, or None")
        pinned_dicts = [p.as_openai() if isinstance(p, StoredMessage) else validate_message(p).as_openai()
                        for p in pinned]
        if prune is None:
            prune = memory_settings.PRUNE_COMPACTED
        using = router.db_for_write(Snapshot)
        try:
            with transaction.atomic(using=using):
                try:
                    session = Session.objects.select_for_update().get(pk=self.session.pk)
                except Session.DoesNotExist:
                    raise SessionNotFound(f"session {self.session.pk} was deleted") from None
                latest = Snapshot.objects.filter(session=session).order_by("-version").first()
                current_version = latest.version if latest else None
                if current_version != expected:
                    raise SnapshotConflict(expected, _snapshot_view(latest))
                floor = latest.upto if latest else 0
                if upto <= floor:
                    raise InvalidCursor(f"upto={upto} does not move past the latest snapshot (upto={floor})",
                                        field="upto")
                if upto >= session.next_seq:
                    raise InvalidCursor(f"upto={upto} lies beyond the log (last cursor {session.next_seq - 1})",
                                        field="upto")
                snapshot = Snapshot.objects.create(
                    session=session, version=(current_version or 0) + 1, upto=upto,
                    summary=summary, pinned=pinned_dicts, model=model, metadata=metadata or {},
                )
                tail_tokens = Message.objects.filter(session=session, seq__gt=upto).aggregate(
                    t=Sum("token_count"))["t"] or 0
                updates = {"tokens_since_snapshot": tail_tokens, "updated_at": timezone.now()}
                if prune:
                    covered = _prunable(session, upto)
                    gone = covered.aggregate(t=Sum("token_count"))["t"] or 0
                    deleted = covered.delete()[1].get(Message._meta.label, 0)
                    updates["message_count"] = session.message_count - deleted
                    updates["token_count"] = session.token_count - gone
                Session.objects.filter(pk=session.pk).update(**updates)
        except IntegrityError:
            # Another writer took this version between our read and insert.
            raise SnapshotConflict(expected, self.latest_snapshot()) from None
        return _snapshot_view(snapshot)

    def prune_compacted(self) -> int:
        """Delete the messages the latest snapshot stands for (not remembered ones); returns how many."""
        using = router.db_for_write(Message)
        with transaction.atomic(using=using):
            session = Session.objects.select_for_update().get(pk=self.session.pk)
            latest = Snapshot.objects.filter(session=session).order_by("-version").first()
            if latest is None:
                return 0
            covered = _prunable(session, latest.upto)
            gone = covered.aggregate(t=Sum("token_count"))["t"] or 0
            deleted = covered.delete()[1].get(Message._meta.label, 0)
            Session.objects.filter(pk=session.pk).update(
                message_count=session.message_count - deleted, token_count=session.token_count - gone
            )
            return deleted

    # -- compaction (summarization) -----------------------------------------------------------
    def compact(
        self,
        keep_recent: int | None = None,
        summarizer: Summarizer | None = None,
        *,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
    ) -> SnapshotView | None:
        """Fold all but the newest ``keep_recent`` messages into the summary, by compare-and-swap.

        The summarizer (default: the ``SUMMARIZER`` setting) updates the previous summary with
        the newly covered messages; the covered range ends on a whole tool group. Messages
        appended meanwhile stay after the new snapshot. On ``SnapshotConflict`` it reloads and
        tries again, ``max_attempts`` times in all (default ``SUMMARIZE_MAX_ATTEMPTS``). A run
        with an ``idempotency_key`` already on a snapshot saves nothing and returns that one.
        Returns the new snapshot, or ``None`` if there was nothing to cover. See
        ``memory_app.compaction``.
        """
        from .compaction import compact

        return compact(self, keep_recent=keep_recent, summarizer=summarizer,
                       max_attempts=max_attempts, idempotency_key=idempotency_key)

    def summarize_async(self, keep_recent: int | None = None) -> str:
        """Enqueue the ``summarize_session`` task for this session; returns the task id.

        Without a broker (eager mode) the task runs now, in this process.
        """
        from .tasks import summarize_session

        kwargs = {} if keep_recent is None else {"keep_recent": keep_recent}
        return summarize_session.apply_async(args=[str(self.session.pk)], kwargs=kwargs).id

    # -- title and metadata -------------------------------------------------------------------
    @property
    def title(self) -> str:
        return Session.objects.filter(pk=self.session.pk).values_list("title", flat=True).get()

    def set_title(self, title: str) -> None:
        _validate_session_fields(title=title)
        Session.objects.filter(pk=self.session.pk).update(title=title, updated_at=timezone.now())
        self.session.title = title

    @property
    def meta(self) -> dict:
        return Session.objects.filter(pk=self.session.pk).values_list("metadata", flat=True).get()

    def set_meta(self, key: str, value: Any) -> dict:
        """Set one metadata key (an empty value removes it); returns the new metadata."""
        if not isinstance(key, str) or not key:
            raise InvalidSession("metadata", "a metadata key must be a non-empty string")
        if problem := unstorable(key) or unstorable(value):
            raise InvalidSession("metadata", problem)
        with transaction.atomic(using=router.db_for_write(Session)):
            session = Session.objects.select_for_update().get(pk=self.session.pk)
            metadata = dict(session.metadata or {})
            if value in (None, "", [], {}):
                metadata.pop(key, None)
            else:
                metadata[key] = value
            Session.objects.filter(pk=session.pk).update(metadata=metadata, updated_at=timezone.now())
        self.session.metadata = metadata
        return metadata

    def update(self, *, title: str | None = None, metadata: dict | None = None,
               expires_at: dt.datetime | None | Any = ...) -> None:
        """Replace title, metadata and/or expiry (the fields a client may edit)."""
        _validate_session_fields(title=title, metadata=metadata)
        changes: dict[str, Any] = {"updated_at": timezone.now()}
        if title is not None:
            changes["title"] = title
        if metadata is not None:
            changes["metadata"] = metadata
        if expires_at is not ...:
            changes["expires_at"] = expires_at
        Session.objects.filter(pk=self.session.pk).update(**changes)
        self.refresh()

    # -- clearing -----------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove messages, snapshots, embeddings and metadata; cursors are never reused."""
        from .owners import delete_session_rows

        with transaction.atomic(using=router.db_for_write(Session)):
            session = Session.objects.select_for_update().get(pk=self.session.pk)
            # One DELETE per table: the deletion collector would load every message first.
            delete_session_rows(Session.objects.filter(pk=session.pk), keep_sessions=True)
            Session.objects.filter(pk=session.pk).update(
                metadata={}, message_count=0, token_count=0, tokens_since_snapshot=0,
                updated_at=timezone.now(),
            )
        self.refresh()

    def delete(self) -> None:
        """Delete the session with its messages, snapshots and embeddings (no-op if gone)."""
        from .owners import delete_session_rows

        with transaction.atomic(using=router.db_for_write(Session)):
            doomed = Session.objects.filter(pk=self.session.pk)
            # Lock first, so an append in flight finishes before (or fails after) the delete.
            if doomed.select_for_update().values_list("pk", flat=True):
                delete_session_rows(doomed)

    # -- undoing the newest message (used by the OpenAI Agents SDK's ``pop_item``) --------------
    def pop_last(self) -> StoredMessage | None:
        """Delete the newest message and return it; ``None`` when the log is empty.

        The log stays append-only in the sense that matters: the popped cursor is never handed
        out again (``next_seq`` does not move back), so a reader holding it sees a gap, never a
        different message. Counters are kept exact under concurrent appends (row lock).
        """
        with transaction.atomic(using=router.db_for_write(Message)):
            try:
                session = Session.objects.select_for_update().get(pk=self.session.pk)
            except Session.DoesNotExist:
                raise SessionNotFound(f"session {self.session.pk} was deleted") from None
            newest = log.rows(Message.objects.filter(session=session).order_by("-seq")[:1])
            if not newest:
                return None
            popped = newest[0]
            Message.objects.filter(session=session, seq=popped.cursor).delete()
            snapshot_upto = (
                Snapshot.objects.filter(session=session).order_by("-version")
                .values_list("upto", flat=True).first()
            ) or 0
            since = session.tokens_since_snapshot
            if popped.cursor > snapshot_upto:
                since = max(0, since - popped.tokens)
            Session.objects.filter(pk=session.pk).update(
                message_count=session.message_count - 1,
                token_count=session.token_count - popped.tokens,
                tokens_since_snapshot=since,
                updated_at=timezone.now(),
            )
        return popped

    # -- export -------------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """The whole session as JSON-serialisable data; ``Memory.import_session`` restores it."""
        self.refresh()
        return {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "session": export_session_fields(self.session),
            "messages": [export_message(m) for m in self.messages()],
            "snapshots": [export_snapshot(v) for v in self.snapshots()],
        }

    # -- async twins --------------------------------------------------------------------------
    async def aadd(self, message: dict[str, Any]) -> StoredMessage:
        return await sync_to_async(self.add)(message)

    async def aadd_many(self, messages: Iterable[dict[str, Any]]) -> list[StoredMessage]:
        return await sync_to_async(self.add_many)(list(messages))

    async def amessages(self, after: int | None = None, limit: int | None = None, *,
                        before: int | None = None) -> list[StoredMessage]:
        return await sync_to_async(self.messages)(after, limit, before=before)

    async def alast(self, n: int) -> list[StoredMessage]:
        return await sync_to_async(self.last)(n)

    async def acursor_range(self) -> tuple[int, int] | None:
        return await sync_to_async(self.cursor_range)()

    async def acount(self) -> int:
        return await sync_to_async(self.count)()

    async def awindow(self, max_messages: int | None = None, max_tokens: int | None = None,
                      *, model: str | None = None) -> Window:
        return await sync_to_async(self.window)(max_messages, max_tokens, model=model)

    async def alatest_snapshot(self) -> SnapshotView | None:
        return await sync_to_async(self.latest_snapshot)()

    async def aload_snapshot(self) -> tuple[SnapshotView | None, list[StoredMessage]]:
        return await sync_to_async(self.load_snapshot)()

    async def asave_snapshot(self, summary: str, **kwargs: Any) -> SnapshotView:
        return await sync_to_async(self.save_snapshot)(summary, **kwargs)

    async def aprune_compacted(self) -> int:
        return await sync_to_async(self.prune_compacted)()

    async def acompact(self, keep_recent: int | None = None, summarizer: Summarizer | None = None,
                       **kwargs: Any) -> SnapshotView | None:
        return await sync_to_async(self.compact)(keep_recent, summarizer, **kwargs)

    async def asummarize_async(self, keep_recent: int | None = None) -> str:
        return await sync_to_async(self.summarize_async)(keep_recent)

    async def aset_meta(self, key: str, value: Any) -> dict:
        return await sync_to_async(self.set_meta)(key, value)

    async def ameta(self) -> dict:
        return await sync_to_async(lambda: self.meta)()

    async def aclear(self) -> None:
        await sync_to_async(self.clear)()

    async def adelete(self) -> None:
        await sync_to_async(self.delete)()

    async def aexport(self) -> dict[str, Any]:
        return await sync_to_async(self.export)()

    async def apop_last(self) -> StoredMessage | None:
        return await sync_to_async(self.pop_last)()


def _prunable(session: Session, upto: int):
    """Messages a snapshot covers that pruning may delete: not remembered, not system prompts."""
    return Message.objects.filter(session=session, seq__lte=upto, remember=False).exclude(role="system")


# Async twins of the entry points.
Memory.asession = staticmethod(sync_to_async(Memory.session))
Memory.acreate = staticmethod(sync_to_async(Memory.create))
Memory.aget = staticmethod(sync_to_async(Memory.get))
Memory.asessions = staticmethod(sync_to_async(Memory.sessions))
Memory.aimport_session = staticmethod(sync_to_async(Memory.import_session))


def _validate_session_fields(*, key: Any = None, namespace: Any = None, title: Any = None,
                             metadata: Any = None) -> None:
    if key is not None and (not isinstance(key, str) or not key.strip() or len(key) > 255):
        raise InvalidSession("key", "must be a non-empty string of at most 255 characters")
    if namespace is not None and (not isinstance(namespace, str) or not namespace.strip() or len(namespace) > 100):
        raise InvalidSession("namespace", "must be a non-empty string of at most 100 characters")
    if title is not None and (not isinstance(title, str) or len(title) > 255):
        raise InvalidSession("title", "must be a string of at most 255 characters")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidSession("metadata", "must be an object")
    for field, value in (("key", key), ("namespace", namespace), ("title", title), ("metadata", metadata)):
        if problem := unstorable(value):
            raise InvalidSession(field, problem)


#: Largest value of PostgreSQL's integer (token counts, snapshot versions).
_MAX_INT = 2**31 - 1


def _export_int(value: Any, where: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidExport(f"{where} must be an integer from {low} to {high}, not {value!r}")
    return value


def _export_datetime(value: Any, where: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well-formed but impossible, e.g. month 13
        parsed = None
    if parsed is None:
        raise InvalidExport(f"{where} must be an ISO 8601 date-time, not {value!r}")
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        # Stored in UTC: refuse what falls outside Python's years 1..9999 there.
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidExport(f"{where} is out of range: {value!r}") from None


def _import_session(data: Any, *, owner, namespace, key) -> SessionMemory:
    # Everything is checked before the first write, so a bad export is an InvalidExport (or
    # InvalidSession) and never a database error halfway through.
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise InvalidExport(f"not a {EXPORT_FORMAT} export")
    if data.get("version") != EXPORT_VERSION:
        raise InvalidExport(f"unsupported export version {data.get('version')!r}")
    meta = data.get("session")
    raw_messages = data.get("messages", [])
    raw_snapshots = data.get("snapshots", [])
    if not isinstance(meta, dict):
        raise InvalidExport("session must be an object")
    if not isinstance(raw_messages, list) or not isinstance(raw_snapshots, list):
        raise InvalidExport("messages and snapshots must be lists")
    key = key or meta.get("key")
    if key is None:
        raise InvalidExport("missing field: session.key")
    namespace = namespace or meta.get("namespace") or memory_settings.DEFAULT_NAMESPACE
    title = meta.get("title") or ""
    metadata = meta.get("metadata") or {}
    _validate_session_fields(key=key, namespace=namespace, title=title, metadata=metadata)
    expires_at = _export_datetime(meta.get("expires_at"), "session.expires_at")
    created_at = _export_datetime(meta.get("created_at"), "session.created_at")

    stored = []
    for index, raw in enumerate(raw_messages):
        if not isinstance(raw, dict):
            raise InvalidExport(f"message {index} is not an object")
        raw = dict(raw)
        cursor = _export_int(raw.pop("cursor", None), f"message {index}: cursor", low=1,
                             high=MAX_IMPORTED_CURSOR)
        tokens = raw.pop("tokens", None)
        if tokens is not None:
            tokens = _export_int(tokens, f"message {index}: tokens", low=0, high=_MAX_INT)
        created = _export_datetime(raw.pop("created_at", None), f"message {index}: created_at")
        extra = {k: raw.pop(k) for k in list(raw) if k not in
                 {"role", "content", "name", "tool_calls", "tool_call_id", "metadata", "remember",
                  "idempotency_key", "extra"}}
        if extra:
            if raw.get("extra") is not None and not isinstance(raw["extra"], dict):
                raise InvalidExport(f"message {index}: extra must be an object")
            raw["extra"] = {**(raw.get("extra") or {}), **extra}
        if raw.get("idempotency_key") is None:
            raw.pop("idempotency_key", None)
        try:
            message = validate_message(raw)
        except InvalidMessage as err:
            raise InvalidExport(f"message {index}: {err}") from None
        stored.append((cursor, message, tokens, created))
    cursors = [c for c, *_ in stored]
    if cursors != sorted(set(cursors)):
        raise InvalidExport("message cursors must be unique and ascending")
    keys = [m.idempotency_key for _, m, *_ in stored if m.idempotency_key]
    if len(keys) != len(set(keys)):
        raise InvalidExport("message idempotency keys must be unique")
    if meta.get("next_seq") is None:
        next_seq = cursors[-1] + 1 if cursors else 1
    else:
        next_seq = _export_int(meta["next_seq"], "session.next_seq", low=1, high=MAX_IMPORTED_CURSOR)
    if cursors and next_seq <= cursors[-1]:
        raise InvalidExport("next_seq must lie past the last message")

    snapshots = []
    for index, snap in enumerate(raw_snapshots):
        where = f"snapshot {index}"
        if not isinstance(snap, dict):
            raise InvalidExport(f"{where} is not an object")
        version = _export_int(snap.get("version"), f"{where}: version", low=1, high=_MAX_INT)
        upto = _export_int(snap.get("upto"), f"{where}: upto", low=1, high=MAX_IMPORTED_CURSOR)
        summary, model = snap.get("summary"), snap.get("model") or ""
        pinned, snap_meta = snap.get("pinned") or [], snap.get("metadata") or {}
        if not isinstance(summary, str) or not summary.strip() or unstorable(summary):
            raise InvalidExport(f"{where}: summary must be a non-empty string")
        if not isinstance(model, str) or len(model) > 200 or unstorable(model):
            raise InvalidExport(f"{where}: model must be a string of at most 200 characters")
        if not isinstance(snap_meta, dict) or unstorable(snap_meta):
            raise InvalidExport(f"{where}: metadata must be an object")
        if not isinstance(pinned, list):
            raise InvalidExport(f"{where}: pinned must be a list of messages")
        for i, p in enumerate(pinned):
            try:
                validate_message(p)
            except InvalidMessage as err:
                raise InvalidExport(f"{where}: pinned message {i}: {err}") from None
        created = _export_datetime(snap.get("created_at"), f"{where}: created_at")
        snapshots.append((version, upto, summary, pinned, model, snap_meta, created))
    snapshots.sort(key=lambda s: s[0])
    last_upto, last_version = 0, 0
    for version, upto, *_ in snapshots:
        if version == last_version:
            raise InvalidExport(f"snapshot version {version} appears twice")
        if upto <= last_upto or upto >= next_seq:
            raise InvalidExport(f"snapshot {version}: upto {upto} out of order or beyond the log")
        last_upto, last_version = upto, version

    with transaction.atomic(using=router.db_for_write(Session)):
        try:
            with transaction.atomic(using=router.db_for_write(Session)):
                session = Session.objects.create(
                    owner_id=_owner_id(owner), namespace=namespace, key=key, title=title,
                    metadata=metadata, expires_at=expires_at, next_seq=next_seq,
                )
        except IntegrityError:
            raise SessionExists(f"session {key!r} already exists in namespace {namespace!r}") from None
        rows = []
        for cursor, m, _claimed_tokens, created in stored:
            tokens = count_message(m.as_openai())
            m = encrypt_row(m)  # as the log stores it (a no-op without encryption)
            row = Message(
                session=session, seq=cursor, role=m.role, content=m.content,
                content_parts=m.content_parts, name=m.name, tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id, extra=m.extra, metadata=m.metadata,
                # Recounted, never taken from the export: counts drive windows and
                # summarization, and a made-up count would skew both (or trigger runs).
                token_count=tokens,
                remember=m.remember, idempotency_key=m.idempotency_key,
            )
            if created:
                row.created_at = created
            rows.append(row)
        Message.objects.bulk_create(rows, batch_size=1000)
        for version, upto, summary, pinned, model, snap_meta, created in snapshots:
            snapshot = Snapshot(
                session=session, version=version, upto=upto, summary=summary, pinned=pinned,
                model=model, metadata=snap_meta,
            )
            if created:
                snapshot.created_at = created
            snapshot.save()
        total = sum(r.token_count for r in rows)
        since = sum(r.token_count for r in rows if r.seq > last_upto)
        Session.objects.filter(pk=session.pk).update(
            message_count=len(rows), token_count=total, tokens_since_snapshot=since,
            created_at=created_at or session.created_at,
        )
    return SessionMemory(Session.objects.get(pk=session.pk))
