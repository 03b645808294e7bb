"""Celery tasks: thin wrappers over ``services.background``, safe under at-least-once delivery.

After an append or an import commits, the session's after-append job is one ``index_session``
task (at most one queued per session at a time): it indexes the new messages for recall and
starts ``summarize_session`` when the session is over the threshold.

Embedding tasks only store what is missing (unique message + model, conflicts ignored), so a
redelivered or duplicated task is harmless; compaction is keyed by the task id, so a redelivered
summarize task saves nothing twice. ``acks_late`` + ``reject_on_worker_lost``: a worker lost
mid-task leaves the message on the queue for another worker. Provider hiccups are retried with
exponential backoff and jitter. With no broker the demo project runs them inline.

The sweeps (``prune_expired``, ``apply_retention``, ``sweep_summaries``, ``sweep_embeddings``)
are for Celery beat: thin wrappers over ``services.retention``, each returning its counts, each
safe to run twice at once. ``route_task`` sends embedding and summarization to their own queues
(``MEMORY_APP["TASK_QUEUES"]``) for hosts that set
``CELERY_TASK_ROUTES = ["memory_app.tasks.route_task"]``.
"""

from __future__ import annotations

from celery import Task, shared_task

from .conf import memory_settings
from .exceptions import (
    ExtractorError,
    SnapshotConflict,
    SummarizerError,
    TransientEmbedderError,
)
from .services import background, retention

_AT_LEAST_ONCE = {"acks_late": True, "reject_on_worker_lost": True}
_EMBED_RETRY = {
    **_AT_LEAST_ONCE,
    "autoretry_for": (TransientEmbedderError,),
    "retry_backoff": 2,
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": 6,
}


@shared_task(name=background.AFTER_APPEND_TASK, **_EMBED_RETRY)
def index_session(session_id: str) -> int:
    """The after-append job: index the session's new messages for recall (full text, vectors)
    and check the summarize threshold. Queued at most once per session at a time; the key that
    says so is cleared first, so an append committed from now on queues the next run."""
    background.start_after_append(session_id)
    return background.run_after_append(session_id)


@shared_task(name=background.EMBED_TASK, **_EMBED_RETRY)
def embed_messages(session_id: str, cursors: list[int]) -> int:
    """Embed the messages at ``cursors`` of a session (the embedding sweep queues it for
    remembered messages when ``EMBED_ON_APPEND`` is off; appends go through ``index_session``)."""
    return background.run_embedding(session_id, cursors=cursors)


@shared_task(name=background.REEMBED_TASK, **_EMBED_RETRY)
def embed_session(session_id: str, reembed: bool = True) -> int:
    """Embed a whole session with the configured embedder (again with ``reembed``)."""
    return background.run_embedding(session_id, reembed=reembed)


class SummarizeSessionTask(Task):
    """Releases the session's summarize lock once the task is over (not between retries)."""

    def after_return(self, status, retval, task_id, args, kwargs, einfo) -> None:
        session_id = args[0] if args else (kwargs or {}).get("session_id")
        background.release_summary_lock(session_id, task_id)


@shared_task(
    bind=True,
    base=SummarizeSessionTask,
    name=background.SUMMARIZE_TASK,
    **_AT_LEAST_ONCE,
    # Provider failures (and a lost compare-and-swap race, after its own quick retries) are
    # retried with exponential backoff and jitter: 1 s, 2 s, 4 s... up to 5 minutes.
    autoretry_for=(SummarizerError, SnapshotConflict),
    retry_backoff=True,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
)
def summarize_session(self, session_id: str, keep_recent: int | None = None) -> dict | None:
    """Compact one session; idempotent under redelivery. ``{"version", "upto", "partial"}`` of
    the snapshot saved, or ``None`` when there was nothing to cover or the session is gone."""
    result = background.run_summary(session_id, keep_recent=keep_recent, task_id=self.request.id)
    if result is not None and result["partial"] and not self.request.is_eager:
        # Cut short by SUMMARIZE_MAX_INPUT_TOKENS (a backlog): a follow-up run covers the rest
        # now rather than at the next append.
        background.release_summary_lock(session_id, self.request.id)
        background.schedule_summary(session_id, keep_recent=keep_recent)
    return result


class ExtractMemoriesTask(Task):
    """Releases the session's extraction key once the task is over (not between retries)."""

    def after_return(self, status, retval, task_id, args, kwargs, einfo) -> None:
        session_id = args[0] if args else (kwargs or {}).get("session_id")
        background.release_extract_lock(session_id, task_id)


@shared_task(
    bind=True,
    base=ExtractMemoriesTask,
    name=background.EXTRACT_TASK,
    **_AT_LEAST_ONCE,
    autoretry_for=(ExtractorError, TransientEmbedderError),
    retry_backoff=True,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
)
def extract_memories(self, session_id: str) -> dict | None:
    """Learn facts about the session's owner from its waiting messages; idempotent under
    redelivery (a compare-and-swap on the session's ``extracted_upto``)."""
    return background.run_extraction(session_id)


# ---- sweeps, for Celery beat -----------------------------------------------------------------
PRUNE_EXPIRED_TASK = "memory_app.prune_expired"
APPLY_RETENTION_TASK = "memory_app.apply_retention"
SWEEP_SUMMARIES_TASK = "memory_app.sweep_summaries"
SWEEP_EMBEDDINGS_TASK = "memory_app.sweep_embeddings"


@shared_task(name=PRUNE_EXPIRED_TASK, **_AT_LEAST_ONCE)
def prune_expired(batch_size: int | None = None) -> dict[str, int]:
    """Delete expired sessions in batches; the counts of what went."""
    return retention.prune_expired(batch_size)


@shared_task(name=APPLY_RETENTION_TASK, **_AT_LEAST_ONCE)
def apply_retention(batch_size: int | None = None) -> dict[str, dict]:
    """Expired and idle sessions go, logs are trimmed to ``max_messages``, per ``RETENTION``."""
    return retention.apply_retention(batch_size)


@shared_task(name=SWEEP_SUMMARIES_TASK, **_AT_LEAST_ONCE)
def sweep_summaries(batch_size: int | None = None) -> dict[str, int]:
    """Schedule summaries the after-append trigger missed (sessions over the threshold)."""
    return retention.sweep_summaries(batch_size)


@shared_task(name=SWEEP_EMBEDDINGS_TASK, **_AT_LEAST_ONCE)
def sweep_embeddings(
    batch_size: int | None = None, pending_older_than: float = 60.0
) -> dict[str, int]:
    """Schedule the after-append job of sessions whose messages are still marked for indexing
    ``pending_older_than`` seconds after their append, and embedding of sessions with messages
    that have no vector yet."""
    return retention.sweep_embeddings(batch_size, pending_older_than=pending_older_than)


# ---- routing -----------------------------------------------------------------------------------
#: The kind of each task, as ``MEMORY_APP["TASK_QUEUES"]`` names its queue.
TASK_KINDS = {
    background.AFTER_APPEND_TASK: "embed",
    background.EMBED_TASK: "embed",
    background.REEMBED_TASK: "embed",
    background.SUMMARIZE_TASK: "summarize",
    # A model call per batch, like a summary: the same queue.
    background.EXTRACT_TASK: "summarize",
    PRUNE_EXPIRED_TASK: "maintenance",
    APPLY_RETENTION_TASK: "maintenance",
    SWEEP_SUMMARIES_TASK: "maintenance",
    SWEEP_EMBEDDINGS_TASK: "maintenance",
}


def route_task(name, args=None, kwargs=None, options=None, task=None, **kw) -> dict | None:
    """A Celery router (``CELERY_TASK_ROUTES = ["memory_app.tasks.route_task"]``): embedding
    and summarization tasks to their queues from ``MEMORY_APP["TASK_QUEUES"]``; a kind whose
    queue is ``None``, and every other task, to the next router or the default queue."""
    kind = TASK_KINDS.get(name)
    if kind is None:
        return None
    queue = (memory_settings.TASK_QUEUES or {}).get(kind)
    return {"queue": queue} if queue else None
