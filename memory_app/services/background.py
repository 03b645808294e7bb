"""The one way to schedule background work (summaries, embedding), used by the facade, the
append signal's receivers, the admin, the API and the sweeps alike.

With a broker configured, work is published as a Celery task (``memory_app.tasks``, found by
name in the Celery app's registry, so this layer never imports the tasks module above it).
Publishing fails fast when the broker is away (one connection attempt), and a failure is
reported, never raised at the caller unless asked: the sweeps (``memory_summarize
--over-threshold``, ``memory_embed``) catch up later. With no broker (``CELERY_TASK_ALWAYS_EAGER``,
or Celery not installed) the same work runs inline, now, in this process.

Summaries are scheduled at most once per session at a time: a Redis ``SET NX EX`` lock keyed by
session, released when the task ends (and expiring after ``SUMMARIZE_LOCK_SECONDS`` if it is
lost); inline runs take a process-local lock instead. Each call answers a ``Scheduled``: queued,
ran (inline), pending (one is already queued or running), or failed.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any

from django.db import connection, connections, router

from ..conf import memory_settings
from ..exceptions import SessionNotFound, SnapshotConflict, SummarizerError
from ..models import Message, Session
from ..store import snapshots
from ..types import Scheduled
from . import compaction, embedding, extraction, indexing

logger = logging.getLogger(__name__)

SUMMARIZE_TASK = "memory_app.summarize_session"
EMBED_TASK = "memory_app.embed_messages"
REEMBED_TASK = "memory_app.embed_session"
AFTER_APPEND_TASK = "memory_app.index_session"
EXTRACT_TASK = "memory_app.extract_memories"
#: Prefix of the "one extraction per session at a time" keys (the summarize lock's Redis).
EXTRACT_LOCK_PREFIX = "memory_app:extract:"


# ---- what the tasks (and inline runs) do ---------------------------------------------------------
def run_summary(
    session_id, *, keep_recent: int | None = None, task_id: str | None = None
) -> dict | None:
    """Compact one session, keyed by ``task_id`` (a redelivered task saves nothing twice).
    ``{"version", "upto", "partial"}`` of the snapshot saved, or ``None`` (nothing to cover, or
    the session is gone). Raises ``SummarizerError`` / ``SnapshotConflict`` for a retry."""
    try:
        snapshot = compaction.compact(session_id, keep_recent=keep_recent, idempotency_key=task_id)
    except SessionNotFound:
        logger.info("summarize: session %s no longer exists", session_id)
        return None
    if snapshot is None:
        return None
    return {
        "version": snapshot.version,
        "upto": snapshot.upto,
        "partial": bool(snapshot.metadata.get("partial")),
    }


def run_embedding(session_id, *, cursors: list[int] | None = None, reembed: bool = False) -> int:
    """Embed a session's messages (only ``cursors`` when given; all again with ``reembed``)."""
    if not Session.objects.filter(pk=session_id).exists():
        return 0  # deleted since: nothing to do
    return embedding.embed_messages(session_ids=[session_id], cursors=cursors, replace=reembed)


def run_after_append(session_id) -> int:
    """The after-append job: index the session's new messages for recall, then check the
    summarize threshold and whether a batch waits for memory extraction. Returns how many
    messages were indexed (0 if the session is gone: its messages went with it, and the checks
    find no session row)."""
    indexed = indexing.index_new_messages(session_id)
    summarize_if_needed(session_id)
    extract_if_needed(session_id)
    return indexed


def run_extraction(session_id) -> dict | None:
    """Learn from the session's waiting messages (``services.extraction``)."""
    try:
        return extraction.extract(session_id)
    except SessionNotFound:
        return None


# ---- the broker ----------------------------------------------------------------------------------
def _celery():
    """The Celery app, or ``None`` when Celery is not installed (then everything runs inline)."""
    try:
        from celery import current_app
    except ImportError:
        return None
    return current_app


def inline() -> bool:
    """Whether background work runs now, in this process (no broker configured)."""
    app = _celery()
    return app is None or bool(app.conf.task_always_eager)


def _publish(name: str, *, args: list, kwargs: dict, task_id: str) -> None:
    app = _celery()
    task = app.tasks[name]
    # Fail fast rather than hold up the request that appended while the broker is away (by
    # default kombu keeps reconnecting for seconds).
    with app.pool.acquire(block=True) as connection:
        connection.ensure_connection(max_retries=1, interval_start=0)
        task.apply_async(
            args=args, kwargs=kwargs, task_id=task_id, connection=connection, retry=False
        )


# ---- the summarize lock --------------------------------------------------------------------------
_RELEASE_SCRIPT = """
if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end
return 0
"""
_redis_clients: dict[str, Any] = {}
_local_runs: set[str] = set()
_local_runs_lock = threading.Lock()


def lock_key(session_id) -> str:
    return f"{memory_settings.SUMMARIZE_LOCK_PREFIX}{session_id}"


def _lock_redis():
    """A Redis client for the summarize lock, or ``None`` when no Redis is configured."""
    url = memory_settings.SUMMARIZE_LOCK_URL
    if not url:
        app = _celery()
        broker = (app.conf.broker_url or "") if app is not None else ""
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


@contextmanager
def _local_run(session_id):
    """Inline runs: one summary per session at a time in this process."""
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


def release_summary_lock(session_id, task_id: str) -> None:
    """Release the session's lock if ``task_id`` holds it (called when the task ends)."""
    if not session_id or inline():
        return
    try:
        client = _lock_redis()
        if client is not None:
            client.eval(_RELEASE_SCRIPT, 1, lock_key(session_id), task_id)
    except Exception:
        # The lock expires on its own after SUMMARIZE_LOCK_SECONDS.
        logger.warning(
            "could not release the summarize lock of session %s", session_id, exc_info=True
        )


# ---- scheduling ----------------------------------------------------------------------------------
def schedule_summary(
    session_id, *, keep_recent: int | None = None, fail_silently: bool = True
) -> Scheduled:
    """Summarize the session in the background, unless a run is already queued or running.

    Failures (Redis, the broker, an inline summarizer error) are logged and reported as
    ``Scheduled("failed")``, never raised, unless ``fail_silently=False``.
    """
    task_id = str(uuid.uuid4())
    if inline():
        with _local_run(session_id) as acquired:
            if not acquired:
                return Scheduled("pending")
            try:
                result = run_summary(session_id, keep_recent=keep_recent, task_id=task_id)
            except (SummarizerError, SnapshotConflict) as err:
                if not fail_silently:
                    raise
                # Nobody would retry an inline run later: log it; the sweep tries again.
                logger.exception("inline summarization of session %s failed", session_id)
                return Scheduled("failed", task_id, error=str(err))
        return Scheduled("ran", task_id, result=result)
    kwargs = {} if keep_recent is None else {"keep_recent": keep_recent}
    try:
        client = _lock_redis()
        if client is not None and not client.set(
            lock_key(session_id), task_id, nx=True, ex=memory_settings.SUMMARIZE_LOCK_SECONDS
        ):
            return Scheduled("pending")
    except Exception as err:
        if not fail_silently:
            raise
        logger.warning(
            "could not take the summarize lock of session %s; the over-threshold "
            "sweep will enqueue it later",
            session_id,
            exc_info=True,
        )
        return Scheduled("failed", error=str(err))
    try:
        _publish(SUMMARIZE_TASK, args=[str(session_id)], kwargs=kwargs, task_id=task_id)
    except Exception as err:
        release_summary_lock(session_id, task_id)
        if not fail_silently:
            raise
        logger.warning(
            "could not enqueue summarization of session %s; the over-threshold "
            "sweep will enqueue it later",
            session_id,
            exc_info=True,
        )
        return Scheduled("failed", error=str(err))
    return Scheduled("queued", task_id)


def schedule_embedding(
    session_id,
    *,
    cursors: list[int] | None = None,
    reembed: bool = False,
    fail_silently: bool = True,
) -> Scheduled:
    """Embed the session's messages at ``cursors`` (all missing ones when ``None``; all again
    with ``reembed``) in the background. A failure leaves them for ``memory_embed``."""
    task_id = str(uuid.uuid4())
    try:
        if inline():
            return Scheduled(
                "ran", task_id, result=run_embedding(session_id, cursors=cursors, reembed=reembed)
            )
        if reembed or cursors is None:
            _publish(
                REEMBED_TASK, args=[str(session_id)], kwargs={"reembed": reembed}, task_id=task_id
            )
        else:
            _publish(EMBED_TASK, args=[str(session_id), list(cursors)], kwargs={}, task_id=task_id)
    except Exception as err:
        if not fail_silently:
            raise
        logger.warning(
            "could not embed messages of session %s; memory_embed will catch up",
            session_id,
            exc_info=True,
        )
        return Scheduled("failed", task_id, error=str(err))
    return Scheduled("queued", task_id)


# ---- after each append --------------------------------------------------------------------------
def after_append_key(session_id) -> str:
    return f"{memory_settings.AFTER_APPEND_KEY_PREFIX}{session_id}"


def schedule_after_append(session_id) -> Scheduled:
    """Have the after-append job run soon for this session; called once an append committed.

    By default (``AFTER_APPEND = "deferred"``) the session is handed to a background thread of
    this process, so the append returns at the store's own cost: a burst of appends to one
    session is handed over once, and the thread queues the task (broker) or runs the job (no
    broker). ``"immediate"`` does that in the caller's thread. Never raises: whatever is not
    scheduled stays marked in the database for the sweep (a process killed before its thread
    got to it is the same case as one killed right after the commit).
    """
    if memory_settings.AFTER_APPEND == "immediate":
        return after_append_now(session_id)
    _deferred().submit(session_id)
    return Scheduled("queued")


def after_append_now(session_id) -> Scheduled:
    """Queue the session's after-append task, or with no broker run the job now.

    With a broker, at most one task per session is queued at a time: a Redis ``SET NX`` key
    (expiring after ``AFTER_APPEND_DEBOUNCE_MS``) says one is; the task deletes it before it
    reads what is pending, so an append committed after that read queues the next task.
    """
    if inline():
        try:
            return Scheduled("ran", result=run_after_append(session_id))
        except Exception as err:
            if _exiting:
                # Late in interpreter shutdown some libraries refuse work (a model that was
                # never loaded cannot load now): the messages stay marked for the sweep.
                logger.warning(
                    "after-append job of session %s left for the sweep at exit: %s",
                    session_id,
                    err,
                )
            else:
                logger.exception("after-append job of session %s failed", session_id)
            return Scheduled("failed", error=str(err))
    key = after_append_key(session_id)
    client = None
    try:
        client = _lock_redis()
        if client is not None and not client.set(
            key, "1", nx=True, px=int(memory_settings.AFTER_APPEND_DEBOUNCE_MS)
        ):
            return Scheduled("pending")
        task_id = str(uuid.uuid4())
        _publish(AFTER_APPEND_TASK, args=[str(session_id)], kwargs={}, task_id=task_id)
    except Exception as err:
        if client is not None:
            try:
                client.delete(key)  # let the next append try again
            except Exception:
                pass
        logger.warning(
            "could not schedule the after-append job of session %s; the sweep will",
            session_id,
            exc_info=True,
        )
        return Scheduled("failed", error=str(err))
    return Scheduled("queued", task_id)


def start_after_append(session_id) -> None:
    """Called by the task before it reads: appends from now on queue the next task."""
    try:
        client = _lock_redis()
        if client is not None:
            client.delete(after_append_key(session_id))
    except Exception:
        # The key expires on its own; until then appends leave their work to this task's
        # successors or the sweep.
        logger.warning("could not clear the after-append key of %s", session_id, exc_info=True)


class _DeferredRunner:
    """Schedules (broker) or runs (no broker) after-append jobs in one background thread of
    this process.

    Sessions wait in an ordered set, so a burst of appends to one session is handled once:
    the thread lets them gather for ``AFTER_APPEND_DELAY_MS`` after the first is handed over,
    then handles each session once. The thread has its own database connection, closed
    whenever the queue runs dry. ``drain`` (and so the exit) handles what waits at once; what a
    killed process never got to stays marked in the database for the sweep.
    """

    def __init__(self) -> None:
        _drain_before_shutdown()
        self.pid = os.getpid()
        self.queue: dict[str, None] = {}
        self.since = 0.0  # when the oldest waiting session was handed over (monotonic)
        self.running = 0
        self.hurry = 0  # drains under way: no more gathering
        self.condition = threading.Condition()
        self.thread = threading.Thread(
            target=self._loop, name="memory_app-after-append", daemon=True
        )
        self.thread.start()

    def submit(self, session_id) -> None:
        key = str(session_id)
        # Already waiting: its job reads the session after this append committed, so it sees
        # it. Checked without the lock (one dict lookup is atomic), so a burst of appends does
        # not queue on the lock: with 16 writer threads, one holding it while it waited for the
        # GIL kept the others waiting (a tenth of their time).
        if key in self.queue:
            return
        with self.condition:
            first = not self.queue
            self.queue[key] = None
            # Only the first session sets the deadline and wakes the thread: it gathers until
            # then anyway, and waking it for every append would cost a switch per append.
            if first:
                self.since = time.monotonic()
                self.condition.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Handle what waits now and wait until every submitted job has run; whether it did
        within ``timeout``."""
        with self.condition:
            self.hurry += 1
            self.condition.notify_all()
            try:
                return self.condition.wait_for(lambda: not self.queue and not self.running, timeout)
            finally:
                self.hurry -= 1

    def _loop(self) -> None:
        while True:
            with self.condition:
                if not self.queue:
                    self.condition.wait_for(lambda: self.queue)
                # Let appends gather: sessions handed over meanwhile are handled once each.
                deadline = self.since + float(memory_settings.AFTER_APPEND_DELAY_MS) / 1000
                while not self.hurry and (left := deadline - time.monotonic()) > 0:
                    self.condition.wait(left)
                session_id = next(iter(self.queue))
                del self.queue[session_id]
                self.running += 1
            try:
                # after_append_now never raises: it logs, and answers "failed".
                if after_append_now(session_id).state == "failed":
                    connection.close()  # a broken connection is not reused
            finally:
                with self.condition:
                    self.running -= 1
                    if not self.queue:
                        # Closed before drain() returns: a drained runner holds no connection
                        # (a test database dropped next, a process about to exit).
                        connection.close()
                    self.condition.notify_all()


_runner: _DeferredRunner | None = None
_runner_lock = threading.Lock()


def _deferred() -> _DeferredRunner:
    global _runner
    runner = _runner  # set in this process: a forked child starts without one (below)
    if runner is not None:
        return runner
    with _runner_lock:
        if _runner is None:
            _runner = _DeferredRunner()
        return _runner


def _forget_runner_after_fork() -> None:
    # The parent's thread does not exist in a child (a worker forked by gunicorn or Celery):
    # the child starts its own on its first append.
    global _runner
    _runner = None


os.register_at_fork(after_in_child=_forget_runner_after_fork)


def wait_for_deferred(timeout: float | None = None) -> bool:
    """Wait until this process's background thread has handled every session handed to it
    (queued their tasks, or with no broker run their jobs); True when none is left. For
    scripts and tests that read what the jobs write."""
    runner = _runner
    if runner is None or runner.pid != os.getpid():
        return True
    return runner.drain(timeout)


_exiting = False


def _finish_deferred() -> None:
    global _exiting
    _exiting = True
    wait_for_deferred(timeout=30)


atexit.register(_finish_deferred)  # the fallback; what is left by then is quick to finish


def _drain_before_shutdown() -> None:
    """Have this process's jobs finish as interpreter shutdown begins, while libraries still
    work: a short script's last append is embedded before it exits, not left for a sweep.

    ``atexit`` handlers run too late: by then ``concurrent.futures`` refuses new work and new
    imports that register exit hooks fail ("can't register atexit after shutdown"; loading a
    model imports scikit-learn, which imports ``concurrent.futures.process``). Threading's own
    exit hooks run first, newest first: importing ``concurrent.futures`` now puts its hooks
    (and the ones its import would register) before ours, so ours runs ahead of them.
    """
    import concurrent.futures.process  # noqa: F401  (their exit hooks, registered now)
    import concurrent.futures.thread  # noqa: F401

    register = getattr(threading, "_register_atexit", None)  # CPython 3.9+
    if register is None:
        return
    try:
        register(_finish_deferred)
    except RuntimeError:  # the interpreter is shutting down already: atexit drains
        pass


def schedule_after_append_on_commit(session_id, *, using: str | None = None) -> None:
    """Once the current transaction commits (at once outside one), ``schedule_after_append``
    for the session: what an append and an import do after writing messages. A rolled-back
    write starts nothing; a failure to schedule never fails a write that has committed
    (``robust``: what is not done stays marked for the sweep)."""

    db = connections[using or router.db_for_write(Message)]
    if db.autocommit and not db.in_atomic_block:
        # Committed already: what on_commit would do at once, without its bookkeeping on
        # every append.
        schedule_after_append(session_id)  # never raises
        return

    def schedule() -> None:  # a plain function: robust on_commit logs callbacks by __qualname__
        schedule_after_append(session_id)

    db.on_commit(schedule, robust=True)


# ---- memory extraction ---------------------------------------------------------------------------
def extract_lock_key(session_id) -> str:
    return f"{EXTRACT_LOCK_PREFIX}{session_id}"


def release_extract_lock(session_id, task_id: str) -> None:
    """Release the session's extraction key if ``task_id`` holds it (when the task ends)."""
    if not session_id or inline():
        return
    try:
        client = _lock_redis()
        if client is not None:
            client.eval(_RELEASE_SCRIPT, 1, extract_lock_key(session_id), task_id)
    except Exception:  # it expires on its own
        logger.warning("could not release the extraction key of %s", session_id, exc_info=True)


def schedule_extraction(session_id) -> Scheduled:
    """Learn from the session's waiting messages in the background (inline without a broker),
    unless an extraction of it is queued or running. Never raises: what is not scheduled stays
    waiting (``extracted_upto`` does not move) for the next append or ``memory_extract``."""
    task_id = str(uuid.uuid4())
    try:
        if inline():
            return Scheduled("ran", task_id, result=run_extraction(session_id))
        client = _lock_redis()
        if client is not None and not client.set(
            extract_lock_key(session_id),
            task_id,
            nx=True,
            ex=memory_settings.SUMMARIZE_LOCK_SECONDS,
        ):
            return Scheduled("pending")
        try:
            _publish(EXTRACT_TASK, args=[str(session_id)], kwargs={}, task_id=task_id)
        except Exception:
            release_extract_lock(session_id, task_id)
            raise
    except Exception as err:
        logger.warning("could not extract memories of session %s", session_id, exc_info=True)
        return Scheduled("failed", task_id, error=str(err))
    return Scheduled("queued", task_id)


def extract_if_needed(session_id) -> Scheduled | None:
    """Schedule extraction when a batch of the session waits; never raises."""
    try:
        if extraction.needs_extraction(session_id):
            return schedule_extraction(session_id)
    except Exception:
        logger.exception("extraction check of session %s failed", session_id)
    return None


# ---- the threshold -------------------------------------------------------------------------------
def needs_summary(session_id, *, threshold: int | None = None) -> bool:
    """Whether the session is over the token threshold with messages beyond ``keep_recent``."""
    if threshold is None:
        threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
    if threshold is None:
        return False
    row = (
        Session.objects.filter(pk=session_id)
        .values_list("tokens_since_snapshot", "next_seq")
        .first()
    )
    if row is None or row[0] <= threshold:
        return False
    _tokens, next_seq = row
    # Without more than keep_recent messages after the snapshot a run would cover nothing.
    return (next_seq - 1) - snapshots.latest_upto(
        session_id
    ) > memory_settings.SUMMARIZE_KEEP_RECENT


def summarize_if_needed(session_id) -> Scheduled | None:
    """Schedule summarization of a session over the threshold; never raises."""
    try:
        if needs_summary(session_id):
            return schedule_summary(session_id)
    except Exception:
        logger.exception("summarization check of session %s failed", session_id)
    return None
