"""Celery tasks: thin wrappers over the service layer, safe under at-least-once delivery.

With no broker configured the demo project runs them eagerly in-process.
"""

from __future__ import annotations

import logging

from celery import shared_task  # noqa: F401

logger = logging.getLogger(__name__)


# ---- recall: embedding -------------------------------------------------------------------
# Both tasks only store what is missing (unique message + model, conflicts ignored), so a
# redelivered or duplicated task is harmless; acks_late means a worker lost mid-task leaves the
# message on the queue for another worker. Provider hiccups are retried with backoff.

from .exceptions import SessionNotFound  # noqa: E402 (imports kept with their section)
from .providers.embeddings import TransientEmbedderError  # noqa: E402

_EMBED_RETRY = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (TransientEmbedderError,),
    "retry_backoff": 2,
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": 6,
}


@shared_task(name="memory_app.embed_messages", **_EMBED_RETRY)
def embed_messages(session_id: str, cursors: list[int]) -> int:
    """Embed the messages at ``cursors`` of a session (queued after each append commits)."""
    from .memory import ANY_OWNER, Memory

    try:
        mem = Memory.get(session_id, owner=ANY_OWNER)
    except SessionNotFound:
        return 0  # deleted since: nothing to do
    return mem.embed(cursors=cursors)


@shared_task(name="memory_app.embed_session", **_EMBED_RETRY)
def embed_session(session_id: str, reembed: bool = True) -> int:
    """Re-embed a whole session with the configured embedder (the admin's action)."""
    from .memory import ANY_OWNER, Memory

    try:
        mem = Memory.get(session_id, owner=ANY_OWNER)
    except SessionNotFound:
        return 0
    return mem.embed(reembed=reembed)


# ---- summarization (compaction) --------------------------------------------------------------
