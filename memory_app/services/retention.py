"""Retention and the catch-up sweeps, made to run on their own (Celery beat, ``memory_app.tasks``).

Rules every sweep here keeps:

- **Bounded batches**: at most ``batch_size`` sessions per transaction (``SWEEP_BATCH_SIZE`` by
  default), so a sweep over a million sessions never holds locks or memory for long, and an
  interrupted sweep loses at most the batch in flight (rolled back whole; the next run does it).
- **Safe to run twice at once**: a batch is picked with ``SELECT ... FOR UPDATE SKIP LOCKED``
  and worked on under those row locks. Two sweeps running together lock disjoint batches, so
  neither does the other's work, and a row one of them skips is held by the other, which
  finishes it: nothing is lost. A session an agent is appending to right now holds its own row
  lock, so it is skipped too (it is in use) and taken by the next run.
- **Reports what it did**: each returns a dict of counts (JSON, so a Celery task can return it).

The sweeps that schedule work (summaries, embeddings) page through sessions by primary key
without locks: scheduling is deduplicated where it happens (``services.background``: at most
one summary per session at a time; embedding stores only missing vectors), and a session's row
lock must not be held while a task is published.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from django.db import router, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidCursor, InvalidSession
from ..models import Checkpoint, Embedding, Message, Session
from ..providers.embeddings import get_embedder
from ..store import checkpoints, items, policies, sessions, snapshots
from . import background

__all__ = [
    "apply_retention",
    "count_prunable",
    "policy_for",
    "prune",
    "prune_expired",
    "prune_idle",
    "sweep_embeddings",
    "sweep_summaries",
    "trim_checkpoints",
    "trim_to_policy",
]


def policy_for(namespace: str) -> dict[str, Any] | None:
    """The retention policy in force for sessions of ``namespace`` (its own ``RETENTION`` entry,
    else ``"*"``), as ``{"entry", "ttl", "sliding", "max_messages", "idle"}``; ``None`` when no
    policy applies."""
    policy = policies.policy_for(namespace)
    return None if policy is None else policy.as_dict()


def _batch_size(value: Any) -> int:
    if value is None:
        value = memory_settings.SWEEP_BATCH_SIZE
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidCursor(
            f"batch_size must be a positive integer, not {value!r}", field="batch_size"
        )
    return value


def _max_batches(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidCursor(
            f"max_batches must be a positive integer, not {value!r}", field="max_batches"
        )
    return value


def _write_db() -> str:
    return router.db_for_write(Session)


def _delete_in_batches(
    doomed: QuerySet,
    batch_size: int,
    max_batches: int | None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Delete the sessions of ``doomed`` (and everything under them), a locked batch per
    transaction, until none is left that no one else holds; ``progress(sessions)`` after each
    batch."""
    totals: Counter = Counter()
    batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic(using=_write_db()):
            locked = list(
                doomed.order_by("pk")
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:batch_size]
            )
            if not locked:
                break
            erased = sessions.delete_rows(Session.objects.filter(pk__in=locked))
        totals.update(erased.as_dict())
        batches += 1
        if progress is not None:
            progress(len(locked))
    return {
        "sessions": totals["sessions"],
        "messages": totals["messages"],
        "snapshots": totals["snapshots"],
        "embeddings": totals["embeddings"],
        "batches": batches,
    }


def prune_expired(
    batch_size: int | None = None,
    now: dt.datetime | None = None,
    *,
    namespace: str | None = None,
    max_batches: int | None = None,
) -> dict[str, int]:
    """Delete sessions whose ``expires_at`` has passed (at ``now``), with everything under them.

    Returns ``{"sessions", "messages", "snapshots", "embeddings", "batches"}`` deleted."""
    doomed = Session.objects.expired(now or timezone.now())
    if namespace is not None:
        doomed = doomed.filter(namespace=namespace)
    return _delete_in_batches(doomed, _batch_size(batch_size), _max_batches(max_batches))


def _prunable(
    now: dt.datetime, idle: dt.timedelta | str | int | None, namespace: str | None
) -> QuerySet:
    doomed = Session.objects.expired(now)
    if idle is not None:
        doomed = doomed | Session.objects.idle_since(now - _duration(idle, "idle"))
    if namespace is not None:
        doomed = doomed.filter(namespace=namespace)
    return doomed


def count_prunable(
    *, idle: dt.timedelta | str | int | None = None, namespace: str | None = None
) -> int:
    """How many sessions ``prune(idle=..., namespace=...)`` would delete now."""
    return _prunable(timezone.now(), idle, namespace).count()


def prune(
    *,
    idle: dt.timedelta | str | int | None = None,
    namespace: str | None = None,
    batch_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Delete expired sessions and, with ``idle``, sessions not updated for that long (in
    ``namespace`` when given), in locked batches as every sweep here; what ``memory_prune``
    runs. ``progress(sessions)`` after each batch. Counts as ``prune_expired``."""
    doomed = _prunable(timezone.now(), idle, namespace)
    return _delete_in_batches(doomed, _batch_size(batch_size), None, progress)


def _duration(value: Any, field: str) -> dt.timedelta:
    try:
        return policies.parse_duration(value, field)
    except ValueError as err:
        raise InvalidSession(field, str(err).partition(": ")[2]) from None


def prune_idle(
    older_than: dt.timedelta | str | int,
    batch_size: int | None = None,
    namespace: str | None = None,
    *,
    now: dt.datetime | None = None,
    exclude_namespaces: Iterable[str] = (),
    max_batches: int | None = None,
) -> dict[str, int]:
    """Delete sessions not updated for ``older_than`` (a ``timedelta``, ``"90d"`` or seconds),
    only in ``namespace`` when given, never in ``exclude_namespaces``. Counts as
    ``prune_expired``."""
    cutoff = (now or timezone.now()) - _duration(older_than, "older_than")
    doomed = Session.objects.idle_since(cutoff)
    if namespace is not None:
        doomed = doomed.filter(namespace=namespace)
    exclude = list(exclude_namespaces)
    if exclude:
        doomed = doomed.exclude(namespace__in=exclude)
    return _delete_in_batches(doomed, _batch_size(batch_size), _max_batches(max_batches))


def trim_to_policy(
    batch_size: int | None = None, *, namespace: str | None = None, max_batches: int | None = None
) -> dict[str, int]:
    """Bound the working log of sessions in namespaces whose policy sets ``max_messages``:
    delete their oldest messages beyond it that a snapshot already covers (never system or
    remembered messages, never unsummarized ones). Each session is visited once per run.

    Returns ``{"sessions": trimmed, "messages": deleted, "batches"}``."""
    batch_size = _batch_size(batch_size)
    max_batches = _max_batches(max_batches)
    trimmed = deleted = batches = 0
    for where, policy in policies.namespaces_where("max_messages"):
        over = Session.objects.filter(where, message_count__gt=policy.max_messages)
        if namespace is not None:
            over = over.filter(namespace=namespace)
        after = None
        while max_batches is None or batches < max_batches:
            with transaction.atomic(using=_write_db()):
                # Keyset order: a session with nothing prunable is not picked again this run.
                page = over if after is None else over.filter(pk__gt=after)
                locked = list(
                    page.order_by("pk")
                    .select_for_update(skip_locked=True)
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not locked:
                    break
                for session_id in locked:
                    gone = snapshots.trim_covered(session_id, keep=policy.max_messages)
                    trimmed += bool(gone)
                    deleted += gone
            after = locked[-1]
            batches += 1
    return {"sessions": trimmed, "messages": deleted, "batches": batches}


def trim_checkpoints(
    batch_size: int | None = None, *, namespace: str | None = None, max_batches: int | None = None
) -> dict[str, int]:
    """Bound the LangGraph checkpoints of threads in namespaces whose policy sets
    ``max_checkpoints``: keep that many of each checkpoint namespace, newest first, with their
    writes and values; delete the rest. Returns ``{"sessions", "checkpoints", "batches"}``."""
    batch_size = _batch_size(batch_size)
    max_batches = _max_batches(max_batches)
    results: Counter = Counter()
    for where, policy in policies.namespaces_where("max_checkpoints"):
        holding = Session.objects.filter(
            where, Exists(Checkpoint.objects.filter(session=OuterRef("pk")))
        )
        if namespace is not None:
            holding = holding.filter(namespace=namespace)
        for ids in _pages(holding, batch_size, max_batches):
            results["batches"] += 1
            for session_id in ids:
                gone = checkpoints.prune([session_id], keep=policy.max_checkpoints)
                results["sessions"] += bool(gone)
                results["checkpoints"] += gone
    return {key: results[key] for key in ("sessions", "checkpoints", "batches")}


def apply_retention(
    batch_size: int | None = None, now: dt.datetime | None = None
) -> dict[str, dict]:
    """Everything the ``RETENTION`` policies ask for, in one run: expired sessions go, sessions
    idle longer than their namespace's ``idle`` go, logs are trimmed to ``max_messages``,
    LangGraph threads to ``max_checkpoints``, and store items past their TTL are deleted."""
    now = now or timezone.now()
    idle: Counter = Counter()
    named = [ns for ns in policies.policies() if ns != policies.DEFAULT_ENTRY]
    for namespace, policy in policies.policies().items():
        if policy.idle is None:
            continue
        if namespace == policies.DEFAULT_ENTRY:
            idle.update(prune_idle(policy.idle, batch_size, now=now, exclude_namespaces=named))
        else:
            idle.update(prune_idle(policy.idle, batch_size, namespace, now=now))
    return {
        "expired": prune_expired(batch_size, now),
        "idle": {
            key: idle[key] for key in ("sessions", "messages", "snapshots", "embeddings", "batches")
        },
        "trimmed": trim_to_policy(batch_size),
        "checkpoints": trim_checkpoints(batch_size),
        "items": {"expired": items.sweep_expired(now, batch_size=_batch_size(batch_size))},
    }


# ---- catch-up sweeps: work the after-append triggers could not schedule ---


def _pages(candidates: QuerySet, batch_size: int, max_batches: int | None):
    """Primary keys of ``candidates``, ``batch_size`` per query (keyset, no OFFSET)."""
    after = None
    batches = 0
    while max_batches is None or batches < max_batches:
        page = candidates if after is None else candidates.filter(pk__gt=after)
        ids = list(page.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return
        yield ids
        after = ids[-1]
        batches += 1


def _tally(results: Counter, scheduled) -> None:
    results[scheduled.state] += 1


def sweep_summaries(
    batch_size: int | None = None, *, threshold: int | None = None, max_batches: int | None = None
) -> dict[str, int]:
    """Schedule summarization of sessions whose tokens after their latest snapshot exceed
    ``threshold`` (``SUMMARIZE_THRESHOLD_TOKENS`` by default) with messages to cover.

    A session already queued or running is not queued again (the per-session summarize lock),
    so two sweeps at once schedule each session once. Returns ``{"checked", "queued", "ran",
    "pending", "failed", "skipped", "batches"}``."""
    if threshold is None:
        threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
    results: Counter = Counter()
    if threshold is None:
        return _summary_counts(results)
    candidates = Session.objects.filter(tokens_since_snapshot__gt=threshold)
    for ids in _pages(candidates, _batch_size(batch_size), _max_batches(max_batches)):
        results["batches"] += 1
        for session_id in ids:
            results["checked"] += 1
            if not background.needs_summary(session_id, threshold=threshold):
                results["skipped"] += 1
                continue
            _tally(results, background.schedule_summary(session_id))
    return _summary_counts(results)


def _summary_counts(results: Counter) -> dict[str, int]:
    return {
        key: results[key]
        for key in ("checked", "queued", "ran", "pending", "failed", "skipped", "batches")
    }


def sweep_embeddings(
    batch_size: int | None = None,
    *,
    max_batches: int | None = None,
    pending_older_than: float = 60.0,
) -> dict[str, int]:
    """Catch up with indexing for recall.

    First the sessions with messages still marked ``index_pending`` ``pending_older_than``
    seconds after their append (the after-append job never ran: a crash between the commit
    and the scheduling, a lost task): their job is scheduled again. Then sessions with messages
    that have no vector from the configured embedder (after a change of embedder; only
    remembered ones when ``EMBED_ON_APPEND`` is off, as the append does).

    Both jobs store only what is missing (one vector per message and model), so a session
    scheduled by two sweeps at once gets each vector once. Returns ``{"sessions", "queued",
    "ran", "failed", "batches", "caught_up"}`` (``caught_up``: sessions of the first kind)."""
    results: Counter = Counter()
    batch = _batch_size(batch_size)
    limit = _max_batches(max_batches)
    cutoff = timezone.now() - dt.timedelta(seconds=pending_older_than)
    stale = Message.objects.filter(index_pending=True, created_at__lte=cutoff)
    for ids in _pages(
        Session.objects.filter(Exists(stale.filter(session=OuterRef("pk")))), batch, limit
    ):
        results["batches"] += 1
        for session_id in ids:
            results["sessions"] += 1
            results["caught_up"] += 1
            _tally(results, background.schedule_after_append(session_id))
    model = get_embedder().name
    # Pending messages are their job's: only the indexed ones missing a vector are the sweep's.
    missing = (
        Message.objects.filter(index_pending=False)
        .exclude(content="")
        .exclude(Exists(Embedding.objects.filter(message=OuterRef("pk"), model=model)))
    )
    if not memory_settings.EMBED_ON_APPEND:
        missing = missing.filter(remember=True)
    candidates = Session.objects.filter(Exists(missing.filter(session=OuterRef("pk"))))
    for ids in _pages(candidates, batch, limit):
        results["batches"] += 1
        for session_id in ids:
            results["sessions"] += 1
            if memory_settings.EMBED_ON_APPEND:
                scheduled = background.schedule_embedding(session_id)
            else:
                cursors = list(
                    missing.filter(session_id=session_id)
                    .order_by("seq")
                    .values_list("seq", flat=True)[: memory_settings.EMBED_BATCH_SIZE]
                )
                scheduled = background.schedule_embedding(session_id, cursors=cursors)
            _tally(results, scheduled)
    return {
        key: results[key] for key in ("sessions", "queued", "ran", "failed", "batches", "caught_up")
    }
