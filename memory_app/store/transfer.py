"""Export and import of whole sessions, lossless: same cursors, snapshots and metadata.

An export is ``{"format": "memory_app.session", "version": 1, "session": {...}, "messages":
[...], "snapshots": [...]}``. Import checks it whole with the rule book
(``validation.check_import``: exactly the rules of append, snapshot save and session create)
before the first write, then writes it in one transaction.
"""

from __future__ import annotations

import datetime as dt
from contextlib import nullcontext
from typing import Any

from django.contrib.auth import get_user_model
from django.db import router, transaction
from django.utils import timezone

from .. import routers
from ..conf import memory_settings
from ..encryption import encrypt_row
from ..exceptions import InvalidExport
from ..models import Message, Session, Snapshot
from ..tokens import count_message
from ..types import ANY_OWNER, SnapshotView, StoredMessage, openai_dict
from ..validation import EXPORT_FORMAT, EXPORT_VERSION, check_import
from . import log, reads, sessions, snapshots
from .sessions import owner_id as _owner_id

#: Pass as ``owner`` to import for the owner the export names (the default).
FROM_EXPORT: Any = object()


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def session_fields(s: Session) -> dict[str, Any]:
    """The ``session`` part of an export."""
    return {
        "id": str(s.pk),
        "key": s.key,
        "namespace": s.namespace,
        "title": s.title,
        "metadata": s.metadata,
        "owner": s.owner_id,
        "created_at": _iso(s.created_at),
        "updated_at": _iso(s.updated_at),
        "expires_at": _iso(s.expires_at),
        "next_seq": s.next_seq,
    }


def message_fields(m: StoredMessage) -> dict[str, Any]:
    """A message as an export has it: OpenAI form plus cursor and the store's fields."""
    # ``extra`` stays under its own key, so an import reads it exactly as an append would.
    data = openai_dict(
        m.role, m.content, m.content_parts, m.name, m.tool_calls, m.tool_call_id, None
    )
    if m.extra:
        data["extra"] = m.extra
    return {
        **data,
        "cursor": m.cursor,
        "metadata": m.metadata,
        "tokens": m.tokens,
        "remember": m.remember,
        "idempotency_key": m.idempotency_key,
        "created_at": _iso(m.created_at),
    }


def snapshot_fields(v: SnapshotView) -> dict[str, Any]:
    """A snapshot as an export has it."""
    return {
        "version": v.version,
        "upto": v.upto,
        "summary": v.summary,
        "pinned": v.pinned,
        "model": v.model,
        "metadata": v.metadata,
        "created_at": _iso(v.created_at),
    }


def export_head(s: Session) -> dict[str, Any]:
    return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "session": session_fields(s)}


def export_session(session_id) -> dict[str, Any]:
    """The whole session as JSON-serialisable data; ``import_session`` restores it."""
    session = Session.objects.get(pk=session_id)
    # Nothing written for longer than any plausible replica lag: a replica may serve the rest.
    idle = session.updated_at <= timezone.now() - dt.timedelta(
        seconds=memory_settings.REPLICA_IDLE_SECONDS
    )
    with routers.stale_reads() if idle else nullcontext():
        return {
            **export_head(session),
            "messages": [message_fields(m) for m in reads.messages(session.pk)],
            "snapshots": [snapshot_fields(v) for v in snapshots.lineage(session.pk)],
        }


def _import_owner(data: Any, owner: Any) -> Any:
    if owner is ANY_OWNER:
        raise InvalidExport("import for one owner (or None), not ANY_OWNER", field="owner")
    if owner is not FROM_EXPORT:
        return _owner_id(owner)
    named = (
        data.get("session", {}).get("owner")
        if isinstance(data, dict) and isinstance(data.get("session"), dict)
        else None
    )
    if named is None:
        return None
    if isinstance(named, bool) or not isinstance(named, (int, str)):
        raise InvalidExport(
            "session.owner must be a user's primary key or null", field="session.owner"
        )
    User = get_user_model()
    try:
        exists = User._default_manager.filter(pk=named).exists()
    except (ValueError, TypeError):
        exists = False
    if not exists:
        raise InvalidExport(
            f"session.owner: no user {named!r}; pass owner= to import for another",
            field="session.owner",
        )
    return named


def import_session(
    data: Any, *, owner: Any = FROM_EXPORT, namespace: str | None = None, key: str | None = None
) -> Session:
    """Restore an export as a new session of ``owner`` (default: the owner the export names).
    ``SessionExists`` when the key is taken; nothing is written on any error."""
    plan = check_import(data, owner_id=_import_owner(data, owner), key=key, namespace=namespace)
    with transaction.atomic(using=router.db_for_write(Session)):
        # Created as every session is: the namespace's retention gives an expiry when the
        # export has none.
        session = sessions.create(
            owner=plan.owner_id,
            namespace=plan.namespace,
            key=plan.key,
            title=plan.title,
            metadata=plan.metadata,
            expires_at=plan.expires_at,
            next_seq=plan.next_seq,
        )
        rows, stored = [], []
        for imported in plan.messages:
            m = imported.message
            tokens = count_message(m.as_openai())  # recounted, never taken from the export
            row = log.message_row(session.pk, imported.cursor, encrypt_row(m), tokens)
            if imported.created_at:
                row.created_at = imported.created_at
            rows.append(row)
            stored.append((imported.cursor, m, tokens, row))
        Message.objects.bulk_create(rows, batch_size=1000)
        for snap in plan.snapshots:
            snapshot = Snapshot(
                session=session,
                version=snap.version,
                upto=snap.upto,
                summary=snap.summary,
                pinned=snap.pinned,
                model=snap.model,
                metadata=snap.metadata,
            )
            if snap.created_at:
                snapshot.created_at = snap.created_at
            snapshot.save()
        last_upto = plan.snapshots[-1].upto if plan.snapshots else 0
        tokens_since = sum(r.token_count for r in rows if r.seq > last_upto)
        Session.objects.filter(pk=session.pk).update(
            message_count=len(rows),
            token_count=sum(r.token_count for r in rows),
            tokens_since_snapshot=tokens_since,
            created_at=plan.created_at or session.created_at,
        )
        # What follows new messages (indexing for recall, the summarize threshold) follows an
        # import as it follows an append: the same signal, the same receiver.
        log.announce(
            session.pk,
            [
                log.stored_message(cursor, m, tokens, row.created_at, row.pk)
                for cursor, m, tokens, row in stored
            ],
            tokens_since,
        )
    return Session.objects.get(pk=session.pk)
