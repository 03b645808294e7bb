"""Snapshots: the summary that stands for the oldest messages, saved by compare-and-swap.

A snapshot covers every message up to its ``upto`` cursor. Versions are 1, 2, 3... per session
(a unique constraint); a save names the version it read (``expected_version``), and is refused
with ``SnapshotConflict`` when another was saved since. Pruning deletes covered messages, except
system messages and remembered ones; their embeddings stay, holding a copy of the text, as the
long-term memory recall searches (``Embedding``).
"""

from __future__ import annotations

from django.db import IntegrityError, router, transaction
from django.db.models import OuterRef, Subquery, Sum
from django.utils import timezone

from ..exceptions import InvalidCursor, SnapshotConflict
from ..models import Embedding, Message, Session, Snapshot
from ..types import SnapshotView
from ..validation import NewSnapshot, check_cursor
from . import sessions

IDEMPOTENCY_KEY = "idempotency_key"


def view(snapshot: Snapshot | None) -> SnapshotView | None:
    if snapshot is None:
        return None
    return SnapshotView(
        version=snapshot.version,
        upto=snapshot.upto,
        summary=snapshot.summary,
        pinned=list(snapshot.pinned or []),
        model=snapshot.model,
        metadata=dict(snapshot.metadata or {}),
        created_at=snapshot.created_at,
    )


def _latest_row(session_id) -> Snapshot | None:
    return Snapshot.objects.filter(session_id=session_id).order_by("-version").first()


def latest(session_id) -> SnapshotView | None:
    """The latest snapshot of the session, or ``None``."""
    return view(_latest_row(session_id))


def latest_upto(session_id) -> int:
    """The cursor the latest snapshot covers up to (0 without one)."""
    return (
        Snapshot.objects.filter(session_id=session_id)
        .order_by("-version")
        .values_list("upto", flat=True)
        .first()
    ) or 0


def lineage(session_id, newest: int | None = None) -> list[SnapshotView]:
    """Every snapshot version, oldest first; only the latest ``newest`` if given."""
    qs = Snapshot.objects.filter(session_id=session_id)
    if newest is None:
        return [view(s) for s in qs.order_by("version")]
    found = [view(s) for s in qs.order_by("-version")[: check_cursor(newest, "newest")]]
    found.reverse()
    return found


def ranges(session_id) -> list[tuple[int, int]]:
    """``(version, upto)`` of every snapshot, oldest first: the lineage without the summaries."""
    return list(
        Snapshot.objects.filter(session_id=session_id)
        .order_by("version")
        .values_list("version", "upto")
    )


def saved_under(session_id, key: str) -> SnapshotView | None:
    """The snapshot a compaction run with this idempotency key saved, if any."""
    return view(
        Snapshot.objects.filter(session_id=session_id, **{f"metadata__{IDEMPOTENCY_KEY}": key})
        .order_by("-version")
        .first()
    )


def _prunable(session_id, upto: int):
    """Messages a snapshot covers that pruning may delete: not remembered, not system prompts."""
    return Message.objects.filter(session_id=session_id, seq__lte=upto, remember=False).exclude(
        role="system"
    )


def _detach_embeddings(covered) -> int:
    """Keep the pruned messages' long-term memory: their embeddings take a copy of the text (as
    stored: ciphertext under encryption at rest) and let go of the log row. One UPDATE; each
    right-hand side reads the row as it was, so the copy is made before ``message_id`` is NULL."""
    text = Message.objects.filter(pk=OuterRef("message_id")).values("content")[:1]
    return Embedding.objects.filter(message__in=covered.values("pk")).update(
        content=Subquery(text), message=None
    )


def _prune(session: Session, upto: int) -> dict:
    covered = _prunable(session.pk, upto)
    gone = covered.aggregate(t=Sum("token_count"))["t"] or 0
    _detach_embeddings(covered)
    deleted = covered.delete()[1].get(Message._meta.label, 0)
    return {
        "message_count": session.message_count - deleted,
        "token_count": session.token_count - gone,
        "_deleted": deleted,
    }


def save(session_id, new: NewSnapshot, *, prune: bool) -> SnapshotView:
    """Save ``new`` (checked by ``validation.check_snapshot``) by compare-and-swap; see the
    module docstring. ``upto`` must move past the latest snapshot and lie within the log."""
    try:
        with transaction.atomic(using=router.db_for_write(Snapshot)):
            session = sessions.lock(session_id)
            current = _latest_row(session.pk)
            current_version = current.version if current else None
            if current_version != new.expected_version:
                raise SnapshotConflict(new.expected_version, view(current))
            floor = current.upto if current else 0
            if new.upto <= floor:
                raise InvalidCursor(
                    f"upto={new.upto} does not move past the latest snapshot (upto={floor})",
                    field="upto",
                )
            if new.upto >= session.next_seq:
                raise InvalidCursor(
                    f"upto={new.upto} lies beyond the log (last cursor {session.next_seq - 1})",
                    field="upto",
                )
            snapshot = Snapshot.objects.create(
                session=session,
                version=(current_version or 0) + 1,
                upto=new.upto,
                summary=new.summary,
                pinned=new.pinned,
                model=new.model,
                metadata=new.metadata,
            )
            tail_tokens = (
                Message.objects.filter(session=session, seq__gt=new.upto).aggregate(
                    t=Sum("token_count")
                )["t"]
                or 0
            )
            updates = {"tokens_since_snapshot": tail_tokens, "updated_at": timezone.now()}
            if prune:
                updates.update(_prune(session, new.upto))
                updates.pop("_deleted")
            Session.objects.filter(pk=session.pk).update(**updates)
    except IntegrityError:
        # Another writer took this version between our read and insert.
        raise SnapshotConflict(new.expected_version, latest(session_id)) from None
    return view(snapshot)


def prune_covered(session_id) -> int:
    """Delete the messages the latest snapshot stands for (not remembered or system ones);
    returns how many."""
    with transaction.atomic(using=router.db_for_write(Message)):
        session = sessions.lock(session_id)
        current = _latest_row(session.pk)
        if current is None:
            return 0
        updates = _prune(session, current.upto)
        deleted = updates.pop("_deleted")
        Session.objects.filter(pk=session.pk).update(**updates)
        return deleted


def trim_covered(session_id, *, keep: int) -> int:
    """Bound the working log to ``keep`` messages: delete the oldest messages beyond it, but only
    ones the latest snapshot covers (never system or remembered ones, never a message after
    the snapshot). Fewer go when fewer are prunable. Returns how many were deleted.

    Takes the session's row lock (re-entrant when the caller already holds it)."""
    with transaction.atomic(using=router.db_for_write(Message)):
        session = sessions.lock(session_id)
        excess = session.message_count - keep
        if excess <= 0:
            return 0
        upto = latest_upto(session.pk)
        if not upto:
            return 0
        oldest = list(
            _prunable(session.pk, upto).order_by("seq").values_list("pk", "token_count")[:excess]
        )
        if not oldest:
            return 0
        deleted = (
            Message.objects.filter(pk__in=[pk for pk, _ in oldest])
            .delete()[1]
            .get(Message._meta.label, 0)
        )
        Session.objects.filter(pk=session.pk).update(
            message_count=session.message_count - deleted,
            token_count=session.token_count - sum(tokens for _, tokens in oldest),
        )
        return deleted
