"""Celery tasks: thin wrappers over the service layer, safe under at-least-once delivery.

With no broker configured the demo project runs them eagerly in-process.
"""

from __future__ import annotations

import logging

from celery import shared_task  # noqa: F401

logger = logging.getLogger(__name__)


# ---- recall: embedding -------------------------------------------------------------------



# ---- summarization (compaction) --------------------------------------------------------------
from celery import Task  # noqa: E402

from .exceptions import SnapshotConflict, SummarizerError  # noqa: E402


class SummarizeSessionTask(Task):
    """Releases the session's summarize lock once the task is over (not between retries)."""

    def after_return(self, status, retval, task_id, args, kwargs, einfo) -> None:
        from .compaction import release_summary_lock

        session_id = args[0] if args else (kwargs or {}).get("session_id")
        release_summary_lock(session_id, task_id)


@shared_task(
    bind=True,
    base=SummarizeSessionTask,
    name="memory_app.summarize_session",
    # At-least-once: the message is acknowledged only after the task ends, and requeued if the
    # worker dies. A redelivered run is harmless: compaction is keyed by the task id.
    acks_late=True,
    reject_on_worker_lost=True,
    # Provider failures (and a lost compare-and-swap race, after its own quick retries) are
    # retried with exponential backoff and jitter: 1 s, 2 s, 4 s... up to 5 minutes.
    autoretry_for=(SummarizerError, SnapshotConflict),
    retry_backoff=True,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
)
def summarize_session(self, session_id: str, keep_recent: int | None = None) -> dict | None:
    """Compact one session (``SessionMemory.compact``); idempotent under redelivery.

    Returns ``{"version", "upto"}`` of the snapshot this task saved, or ``None`` when there was
    nothing to cover or the session is gone. Run eagerly (no broker), a summarizer failure is
    logged and ``None`` returned instead of retrying.
    """
    from .exceptions import SessionNotFound
    from .memory import ANY_OWNER, Memory

    try:
        mem = Memory.get(session_id, owner=ANY_OWNER)
    except SessionNotFound:
        logger.info("summarize_session: session %s no longer exists", session_id)
        return None
    try:
        snapshot = mem.compact(keep_recent=keep_recent, idempotency_key=self.request.id)
    except (SummarizerError, SnapshotConflict):
        if not self.request.is_eager:
            raise  # retried with backoff
        # Run inline (no broker): nobody would retry later, and the caller is an append or a
        # request that must not fail for this. Log it; the over-threshold sweep tries again.
        logger.exception("summarization of session %s failed", session_id)
        return None
    if snapshot is None:
        return None
    if snapshot.metadata.get("partial") and not self.request.is_eager:
        # The run was cut short by SUMMARIZE_MAX_INPUT_TOKENS (a backlog): a follow-up run
        # covers the rest now rather than at the next append.
        from .compaction import release_summary_lock, request_summary

        release_summary_lock(session_id, self.request.id)
        request_summary(session_id, keep_recent=keep_recent)
    return {"version": snapshot.version, "upto": snapshot.upto}
