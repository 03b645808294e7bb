"""The session row: opening and creating sessions, their editable fields, their lock, and
deleting what is under them.

Ownership is decided here: ``scoped(owner)`` is every query's starting point, so another
owner's session is simply not found (``SessionNotFound``, a 404), never forbidden.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, router, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import SessionExists, SessionNotFound
from ..models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    Embedding,
    Item,
    Message,
    Session,
    Snapshot,
)
from ..types import ANY_OWNER, ErasedRows, SessionInfo
from ..validation import check_metadata, check_metadata_key, check_session_fields
from . import policies


def namespace_or_default(namespace: str | None) -> str:
    """``namespace``, or ``DEFAULT_NAMESPACE`` when none is given."""
    return memory_settings.DEFAULT_NAMESPACE if namespace is None else namespace


def owner_id(owner: Any) -> Any:
    """The owner's primary key (a user, a primary key, ``None`` or ``ANY_OWNER`` as they are)."""
    if owner is None or owner is ANY_OWNER:
        return owner
    return getattr(owner, "pk", owner)


def scoped(owner: Any) -> QuerySet:
    """The sessions ``owner`` may see: their own (``None``: the ownerless ones; ``ANY_OWNER``:
    everyone's, for staff tools)."""
    qs = Session.objects.all()
    if owner is ANY_OWNER:
        return qs
    return qs.for_owner(owner_id(owner))


def owner_check(owner: Any) -> tuple[bool, Any]:
    """``scoped(owner)`` as the two parameters of a statement that checks ownership itself
    (the append): ``(any owner, owner's primary key or None)``, for
    ``(%(any)s OR owner_id IS NOT DISTINCT FROM %(owner)s)``."""
    if owner is ANY_OWNER:
        return True, None
    return False, owner_id(owner)


def checked_id(session_id: Any) -> uuid.UUID:
    """A session id as a UUID; ``SessionNotFound`` for anything that cannot be one."""
    if isinstance(session_id, uuid.UUID):
        return session_id
    try:
        return uuid.UUID(str(session_id))
    except (ValueError, TypeError, AttributeError):
        raise SessionNotFound(f"no session {session_id}") from None


def _write_db() -> str:
    return router.db_for_write(Session)


def get(session_id: uuid.UUID | str, *, owner: Any) -> Session:
    """The session with this id, if ``owner`` may see it; else ``SessionNotFound``."""
    try:
        return scoped(owner).get(pk=session_id)
    except (Session.DoesNotExist, ValueError, TypeError, ValidationError):  # malformed ids too
        raise SessionNotFound(f"no session {session_id}") from None


def lock(session_id) -> Session:
    """The session row, locked for the rest of the transaction (``SELECT ... FOR UPDATE``):
    whoever changes counters, snapshots or the log's head holds it. Call inside ``atomic``."""
    try:
        return Session.objects.select_for_update().get(pk=session_id)
    except Session.DoesNotExist:
        raise SessionNotFound(f"session {session_id} was deleted") from None


def create(
    *,
    owner: Any,
    namespace: str | None,
    key: str,
    title: str | None = "",
    metadata: dict | None = None,
    expires_at: dt.datetime | None = None,
    next_seq: int = 1,
) -> Session:
    """A new session; ``SessionExists`` if the key is taken for that owner and namespace.
    ``next_seq``: the first cursor it hands out (an import restores its cursors)."""
    namespace = namespace_or_default(namespace)
    check_session_fields(
        key=key, namespace=namespace, title=title, metadata=metadata, expires_at=expires_at
    )
    if expires_at is None:
        # The namespace's retention policy (a ttl) decides when a session given no expiry ends.
        expires_at = policies.initial_expiry(namespace, timezone.now())
    try:
        with transaction.atomic(using=_write_db()):
            return Session.objects.create(
                owner_id=owner_id(owner),
                namespace=namespace,
                key=key,
                title=title or "",
                metadata=metadata or {},
                expires_at=expires_at,
                next_seq=next_seq,
            )
    except IntegrityError:
        raise SessionExists(f"session {key!r} already exists in namespace {namespace!r}") from None


def get_or_create(
    key: str,
    *,
    owner: Any,
    namespace: str | None,
    create_missing: bool = True,
    title: str | None = None,
    metadata: dict | None = None,
    expires_at: dt.datetime | None = None,
) -> Session:
    """The session ``key`` of ``owner`` in ``namespace``, created when missing (unless
    ``create_missing`` is false: then ``SessionNotFound``)."""
    namespace = namespace_or_default(namespace)
    check_session_fields(
        key=key, namespace=namespace, title=title, metadata=metadata, expires_at=expires_at
    )
    lookup = Session.objects.for_owner(owner_id(owner)).filter(namespace=namespace, key=key)
    session = lookup.first()
    if session is not None:
        return session
    if not create_missing:
        raise SessionNotFound(f"no session {key!r} in namespace {namespace!r} for this owner")
    try:
        return create(
            owner=owner,
            namespace=namespace,
            key=key,
            title=title,
            metadata=metadata,
            expires_at=expires_at,
        )
    except SessionExists:
        return lookup.get()  # created concurrently: use that one


def list_queryset(owner: Any, namespace: str | None = None) -> QuerySet:
    """The owner's sessions, newest first, annotated with ``has_snapshot``."""
    qs = scoped(owner).with_snapshot_flag().order_by("-updated_at")
    if namespace is not None:
        qs = qs.filter(namespace=namespace)
    return qs


def session_info(s: Session) -> SessionInfo:
    return SessionInfo(
        id=s.id,
        key=s.key,
        namespace=s.namespace,
        title=s.title,
        owner_id=s.owner_id,
        message_count=s.message_count,
        token_count=s.token_count,
        has_snapshot=s.has_snapshot,
        created_at=s.created_at,
        updated_at=s.updated_at,
        expires_at=s.expires_at,
        metadata=s.metadata,
    )


def info(session_id) -> SessionInfo:
    try:
        return session_info(Session.objects.with_snapshot_flag().get(pk=session_id))
    except Session.DoesNotExist:
        raise SessionNotFound(f"session {session_id} was deleted") from None


def field(session_id, name: str) -> Any:
    """One stored field of the session, read afresh."""
    found = Session.objects.filter(pk=session_id).values_list(name, flat=True).first()
    if found is None and not Session.objects.filter(pk=session_id).exists():
        raise SessionNotFound(f"session {session_id} was deleted")
    return found


_UNSET: Any = ...


def update(
    session_id,
    *,
    title: str | None = None,
    metadata: dict | None = None,
    expires_at: dt.datetime | None | Any = _UNSET,
) -> None:
    """Replace title, metadata and/or expiry: the fields a client may edit."""
    check_session_fields(
        title=title,
        metadata=metadata,
        **({} if expires_at is _UNSET else {"expires_at": expires_at}),
    )
    changes: dict[str, Any] = {"updated_at": timezone.now()}
    if title is not None:
        changes["title"] = title
    if metadata is not None:
        changes["metadata"] = metadata
    if expires_at is not _UNSET:
        changes["expires_at"] = expires_at
    if not Session.objects.filter(pk=session_id).update(**changes):
        raise SessionNotFound(f"session {session_id} was deleted")


def set_meta(session_id, key: str, value: Any) -> dict:
    """Set one metadata key (an empty value removes it); returns the new metadata."""
    check_metadata_key(key, value)
    with transaction.atomic(using=_write_db()):
        session = lock(session_id)
        metadata = dict(session.metadata or {})
        if value in (None, "", [], {}):
            metadata.pop(key, None)
        else:
            metadata[key] = value
        check_metadata(metadata)
        Session.objects.filter(pk=session.pk).update(metadata=metadata, updated_at=timezone.now())
    return metadata


# -- deleting ------------------------------------------------------------------------------------
def delete_rows(
    sessions: QuerySet,
    *,
    keep_sessions: bool = False,
    owner_id: Any = None,
    progress: Callable[[str, int], None] | None = None,
) -> ErasedRows:
    """Delete everything under ``sessions`` (a Session queryset: messages, snapshots,
    embeddings, LangGraph checkpoints), and the sessions themselves unless ``keep_sessions``: one
    DELETE per table, children first, nothing loaded into memory.

    Call it inside a transaction that holds the sessions' row locks. ``owner_id`` also deletes
    embeddings filed under that owner whatever their session, and the owner's store items.
    ``progress(table, rows)`` is called after each table.
    """
    using = _write_db()
    ids = sessions.values("pk")
    counts: dict[str, int] = {}

    def gone(name: str, queryset: QuerySet) -> None:
        # QuerySet._raw_delete is the one-statement DELETE Django's own collector uses for
        # "fast deletes"; we can use it because we delete the dependent tables first ourselves.
        counts[name] = queryset._raw_delete(using)
        if progress is not None:
            progress(name, counts[name])

    gone("embeddings", Embedding.objects.filter(session_id__in=ids))
    if owner_id is not None:
        counts["embeddings"] += Embedding.objects.filter(owner_id=owner_id)._raw_delete(using)
    gone("messages", Message.objects.filter(session_id__in=ids))
    gone("snapshots", Snapshot.objects.filter(session_id__in=ids))
    gone("checkpoint_writes", CheckpointWrite.objects.filter(session_id__in=ids))
    gone("checkpoint_blobs", CheckpointBlob.objects.filter(session_id__in=ids))
    gone("checkpoints", Checkpoint.objects.filter(session_id__in=ids))
    if owner_id is not None:
        gone("items", Item.objects.filter(owner_id=owner_id))
    # A session's own memory blocks go with what it holds.
    blocks = Item.objects.filter(session_id__in=ids, kind=Item.BLOCK)._raw_delete(using)
    if not keep_sessions:
        # Items learned in a session outlive it (they are the owner's): only their link goes.
        Item.objects.filter(session_id__in=ids).update(session=None)
        gone("sessions", Session.objects.filter(pk__in=ids))
    counts["items"] = counts.get("items", 0) + blocks
    return ErasedRows(**counts)


def clear(session_id) -> None:
    """Remove messages, snapshots, embeddings and metadata; cursors are never reused."""
    with transaction.atomic(using=_write_db()):
        session = lock(session_id)
        delete_rows(Session.objects.filter(pk=session.pk), keep_sessions=True)
        Session.objects.filter(pk=session.pk).update(
            metadata={},
            message_count=0,
            token_count=0,
            tokens_since_snapshot=0,
            updated_at=timezone.now(),
        )


def delete(session_id) -> bool:
    """Delete the session with everything under it; ``False`` if it was already gone."""
    with transaction.atomic(using=_write_db()):
        doomed = Session.objects.filter(pk=session_id)
        # Lock first, so an append in flight finishes before (or fails after) the delete.
        if not doomed.select_for_update().values_list("pk", flat=True):
            return False
        delete_rows(doomed)
        return True


def delete_batch(session_ids: list) -> int:
    """Delete these sessions (locked first) in one transaction; returns how many went."""
    with transaction.atomic(using=_write_db()):
        batch = Session.objects.filter(pk__in=session_ids)
        locked = list(batch.select_for_update().values_list("pk", flat=True))
        if locked:
            delete_rows(Session.objects.filter(pk__in=locked))
        return len(locked)
