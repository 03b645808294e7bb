"""Compaction: fold the old part of a session's log into its running summary, safely.

``SessionMemory.compact()`` (and the ``summarize_session`` task that calls it) works by
compare-and-swap, so it never needs a lock to be correct:

1. load the latest snapshot and the messages after it;
2. choose the covered range: those messages minus the newest ``keep_recent``, ending on a whole
   tool group (an assistant's tool calls are never summarized apart from their results);
3. ask the summarizer to *update* the previous summary with the covered messages;
4. save the new snapshot at the cursor of the last covered message, expecting the snapshot
   read in step 1. Messages appended meanwhile have higher cursors: they stay after it.
   If another snapshot was saved meanwhile (``SnapshotConflict``), start again from step 1,
   a bounded number of times.

An ``idempotency_key`` (the task id) is stored on the snapshot: a run whose key is already on a
snapshot of the session saves nothing, so a redelivered task never saves a second snapshot.

Triggers: after each append commits, a session whose tokens after its latest snapshot exceed
``SUMMARIZE_THRESHOLD_TOKENS`` is enqueued for summarization, at most once at a time (a Redis
``SET NX EX`` lock keyed by session, released when the task ends). Enqueueing never fails an
append: errors are logged and ``memory_summarize --over-threshold`` catches up later. Without a
broker (eager mode) the task runs inline after the append commits, one run per session at a
time in this process.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import router, transaction

from .conf import memory_settings
from .exceptions import EmptySummary, InvalidSnapshot, SnapshotConflict
from .models import Message, Session, Snapshot
from .signals import messages_appended
from .types import SnapshotView, StoredMessage

if TYPE_CHECKING:
    from .memory import SessionMemory
    from .providers.summarizers import Summarizer

logger = logging.getLogger(__name__)

IDEMPOTENCY_KEY = "idempotency_key"


# ---- choosing what to cover ------------------------------------------------------------------
def covered_range(tail: Sequence[StoredMessage], keep_recent: int,
                  max_tokens: int | None = None) -> list[StoredMessage]:
    """The messages of ``tail`` (those after the latest snapshot, oldest first) to summarize.

    All but the newest ``keep_recent`` (and the oldest of them that fit ``max_tokens``), moved
    back so the range ends on a whole tool group: the first message left out is never a tool
    result, and when the range reaches the end of ``tail`` it does not end with tool calls
    still waiting for results (they would be appended after the snapshot, apart from their
    call). A first group larger than ``max_tokens`` is still covered whole.
    """
    cut = len(tail) - keep_recent
    if cut <= 0:
        return []
    if max_tokens is not None:
        used = 0
        for index, message in enumerate(tail[:cut]):
            used += message.tokens
            if used > max_tokens:
                while index > 0 and tail[index].role == "tool":
                    index -= 1
                if index == 0:  # the first group alone is too large: it still goes whole
                    index = 1
                    while index < cut and tail[index].role == "tool":
                        index += 1
                cut = index
                break
    # Never leave a tool result out while its call (and earlier results) are covered.
    while cut > 0 and cut < len(tail) and tail[cut].role == "tool":
        cut -= 1
    if cut == len(tail):
        start = cut - 1
        while start >= 0 and tail[start].role == "tool":
            start -= 1
        if start >= 0 and tail[start].role == "assistant" and tail[start].tool_calls:
            asked = {call.get("id") for call in tail[start].tool_calls}
            answered = {m.tool_call_id for m in tail[start + 1: cut]}
            if not asked <= answered:
                cut = start  # results still to come: leave the whole group out
    return list(tail[:cut])


def _validated_keep_recent(keep_recent: Any) -> int:
    if keep_recent is None:
        keep_recent = memory_settings.SUMMARIZE_KEEP_RECENT
    if isinstance(keep_recent, bool) or not isinstance(keep_recent, int) or keep_recent < 0:
        raise InvalidSnapshot(f"keep_recent must be a non-negative integer, not {keep_recent!r}")
    return keep_recent


# ---- compaction ------------------------------------------------------------------------------
def compact(
    mem: SessionMemory,
    *,
    keep_recent: int | None = None,
    summarizer: Summarizer | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
) -> SnapshotView | None:
    """Summarize what ``keep_recent`` leaves over; see the module docstring.

    Returns the new snapshot, the snapshot already saved under ``idempotency_key``, or
    ``None`` when there is nothing to cover. Raises ``SummarizerError`` (nothing saved) or,
    once ``max_attempts`` saves have all lost the race, the last ``SnapshotConflict``.
    """
    from .providers.summarizers import get_summarizer

    keep_recent = _validated_keep_recent(keep_recent)
    attempts = max_attempts if max_attempts is not None else memory_settings.SUMMARIZE_MAX_ATTEMPTS
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidSnapshot(f"max_attempts must be a positive integer, not {attempts!r}")
    summarizer = summarizer if summarizer is not None else get_summarizer()
    conflict: SnapshotConflict | None = None
    for attempt in range(1, attempts + 1):
        if idempotency_key:
            done = _saved_under(mem.id, idempotency_key)
            if done is not None:
                return done
        previous, tail = mem.load_snapshot()
        covered = covered_range(tail, keep_recent, memory_settings.SUMMARIZE_MAX_INPUT_TOKENS)
        if not covered:
            return None
        # Cut short by the token budget: a follow-up run covers the rest.
        partial = len(covered) < len(covered_range(tail, keep_recent))
        summary = summarizer.summarize(previous.summary if previous else None, covered)
        if not isinstance(summary, str) or not summary.strip():
            raise EmptySummary(f"{type(summarizer).__name__} returned an empty summary")
        metadata: dict[str, Any] = {
            "covered_from": covered[0].cursor,
            "covered_messages": len(covered),
            "summarizer": f"{type(summarizer).__module__}.{type(summarizer).__qualname__}",
        }
        if idempotency_key:
            metadata[IDEMPOTENCY_KEY] = idempotency_key
        if partial:
            metadata["partial"] = True
        try:
            return mem.save_snapshot(
                summary.strip(),
                upto=covered[-1].cursor,
                prev=previous,
                pinned=previous.pinned if previous else (),
                model=getattr(summarizer, "model", "") or "",
                metadata=metadata,
            )
        except SnapshotConflict as err:
            conflict = err
            logger.info("compaction of session %s lost a race (attempt %d/%d): %s",
                        mem.id, attempt, attempts, err)
    assert conflict is not None
    raise conflict


def _saved_under(session_id, key: str) -> SnapshotView | None:
    from .memory import _snapshot_view

    found = (Snapshot.objects.filter(session_id=session_id, **{f"metadata__{IDEMPOTENCY_KEY}": key})
             .order_by("-version").first())
    return _snapshot_view(found)


# ---- enqueueing, at most once per session at a time -----------------------------------------
_RELEASE_SCRIPT = """
if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end
return 0
"""
_redis_clients: dict[str, Any] = {}
_local_runs: set[str] = set()
_local_runs_lock = threading.Lock()


def _lock_key(session_id) -> str:
    return f"{memory_settings.SUMMARIZE_LOCK_PREFIX}{session_id}"


def _lock_redis():
    """A Redis client for the summarize lock, or ``None`` when no Redis is configured."""
    url = memory_settings.SUMMARIZE_LOCK_URL
    if not url:
        from celery import current_app

        broker = current_app.conf.broker_url or ""
        url = broker if broker.startswith(("redis://", "rediss://", "unix://")) else None
    if not url:
        return None
    client = _redis_clients.get(url)
    if client is None:
        import redis

        # Short timeouts: an unreachable Redis must not hold up the request that appended.
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        _redis_clients[url] = client
    return client


def _broker_is_eager() -> bool:
    from celery import current_app

    return bool(current_app.conf.task_always_eager)


@contextmanager
def _local_run(session_id):
    """Without a broker tasks run inline: one run per session at a time in this process."""
    key = str(session_id)
    with _local_runs_lock:
        acquired = key not in _local_runs
        if acquired:
            _local_runs.add(key)
    try:
        yield acquired
    finally:
        if acquired:
            with _local_runs_lock:
                _local_runs.discard(key)


def request_summary(session_id, *, keep_recent: int | None = None,
                    fail_silently: bool = True) -> str | None:
    """Enqueue ``summarize_session`` unless one is already queued or running for the session.

    Returns the task id, or ``None`` when nothing was enqueued: one is pending, or Redis or the
    broker failed. Failures are logged, never raised (the over-threshold sweep catches up
    later), unless ``fail_silently=False``.
    """
    from celery import current_app

    from .tasks import summarize_session

    task_id = str(uuid.uuid4())
    kwargs = {} if keep_recent is None else {"keep_recent": keep_recent}
    if _broker_is_eager():
        with _local_run(session_id) as acquired:
            if not acquired:
                return None
            try:
                summarize_session.apply_async(args=[str(session_id)], kwargs=kwargs, task_id=task_id)
            except Exception:
                if not fail_silently:
                    raise
                logger.exception("inline summarization of session %s failed", session_id)
                return None
        return task_id
    try:
        client = _lock_redis()
        if client is not None and not client.set(
            _lock_key(session_id), task_id, nx=True, ex=memory_settings.SUMMARIZE_LOCK_SECONDS
        ):
            return None  # a run is already queued or running
    except Exception:
        if not fail_silently:
            raise
        logger.warning("could not take the summarize lock of session %s; the over-threshold "
                       "sweep will enqueue it later", session_id, exc_info=True)
        return None
    try:
        # Fail fast rather than hold up the request that appended while the broker is away
        # (by default kombu keeps reconnecting for seconds).
        with current_app.pool.acquire(block=True) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0)
            summarize_session.apply_async(args=[str(session_id)], kwargs=kwargs, task_id=task_id,
                                          connection=connection, retry=False)
    except Exception:
        release_summary_lock(session_id, task_id)
        if not fail_silently:
            raise
        logger.warning("could not enqueue summarization of session %s; the over-threshold "
                       "sweep will enqueue it later", session_id, exc_info=True)
        return None
    return task_id


def release_summary_lock(session_id, task_id: str) -> None:
    """Release the session's lock if ``task_id`` holds it (called when the task ends)."""
    if not session_id or _broker_is_eager():
        return
    try:
        client = _lock_redis()
        if client is not None:
            client.eval(_RELEASE_SCRIPT, 1, _lock_key(session_id), task_id)
    except Exception:
        # The lock expires on its own after SUMMARIZE_LOCK_SECONDS.
        logger.warning("could not release the summarize lock of session %s", session_id, exc_info=True)


def needs_summary(session_id, *, threshold: int | None = None) -> bool:
    """Whether the session is over the token threshold with messages beyond ``keep_recent``."""
    if threshold is None:
        threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
    if threshold is None:
        return False
    row = Session.objects.filter(pk=session_id).values_list("tokens_since_snapshot", "next_seq").first()
    if row is None or row[0] <= threshold:
        return False
    tokens, next_seq = row
    upto = (Snapshot.objects.filter(session_id=session_id).order_by("-version")
            .values_list("upto", flat=True).first()) or 0
    # Without more than keep_recent messages after the snapshot a run would cover nothing.
    return (next_seq - 1) - upto > memory_settings.SUMMARIZE_KEEP_RECENT


def summarize_if_needed(session_id) -> str | None:
    """Enqueue summarization of a session over the threshold; never raises."""
    try:
        if needs_summary(session_id):
            return request_summary(session_id)
    except Exception:
        logger.exception("summarization check of session %s failed", session_id)
    return None


def summarize_after_append(sender, session_id, messages, tokens_since_snapshot=None, **kwargs) -> None:
    """After the append commits, enqueue summarization if the session went over the threshold."""
    threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
    if threshold is None or not messages:
        return
    if tokens_since_snapshot is not None and tokens_since_snapshot <= threshold:
        return  # the append statement told us: under the threshold, no query needed

    def check() -> None:  # a plain function: robust on_commit logs callbacks by __qualname__
        summarize_if_needed(session_id)

    transaction.on_commit(check, using=router.db_for_write(Message), robust=True)


def connect_signals() -> None:
    """Connect the after-append trigger (called from the app's ``ready()``)."""
    messages_appended.connect(summarize_after_append,
                              dispatch_uid="memory_app.compaction.summarize_after_append")
