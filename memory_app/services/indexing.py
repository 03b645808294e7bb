"""What follows an append: embedding new messages for recall, off the request path.

The append writes everything recall needs that the database can compute in the same statement
(the full-text vector) and marks the rows that still want a vector from the embedder
(``index_pending``: all of them with ``EMBED_ON_APPEND``, the remembered ones otherwise; a
partial index finds them). ``index_new_messages()`` is the one job that catches up with a
session: it embeds its marked messages (less what ``SHOULD_RECALL`` declines) in batches of
``EMBED_BATCH_SIZE`` (one embedder call per batch, not per message), clears the mark (filling
the full-text vector of rows written without one, as imports are), and last checks the
summarize threshold. ``services.background`` runs it (a Celery task, or in this process with no
broker) at most once per session at a time, and only when there is something to do
(``job_wanted``); the sweeps find the sessions whose job never ran.

Every step is idempotent: an embedding is stored once (unique per session, cursor and model), a
vector is filled once (``COALESCE``), the mark is cleared once. So a job that runs twice, or two
at once, stores nothing twice, and a job that dies half-way leaves its messages marked for the
next one. Full-text search reads rows without a vector through the same expression, so nothing
is missing from recall while a job is queued.
"""

from __future__ import annotations

import logging

from ..conf import memory_settings
from ..store import log
from . import embedding

logger = logging.getLogger(__name__)


def job_wanted(messages, tokens_since_snapshot: int) -> bool:
    """Whether an append of ``messages`` leaves the after-append job anything to do: one of
    them marked for a vector (by the rule the append statement marks rows with:
    ``EMBED_ON_APPEND``, or the message is remembered), or the session over the summarize
    threshold. Otherwise the append wrote everything recall needs itself (full text) and no
    job is scheduled at all."""
    if memory_settings.EMBED_ON_APPEND or any(m.remember for m in messages):
        return True
    threshold = memory_settings.SUMMARIZE_THRESHOLD_TOKENS
    return threshold is not None and tokens_since_snapshot > threshold


def index_new_messages(session_id) -> int:
    """Index the session's pending messages for recall; returns how many were indexed.

    Raises what the embedder raises (``EmbedderError``): the messages stay marked, so a retry
    or the sweep picks them up.
    """
    batch_size = int(memory_settings.EMBED_BATCH_SIZE)
    embed_all = memory_settings.EMBED_ON_APPEND
    done = 0
    while True:
        rows = log.pending_index(session_id, batch_size)
        if not rows:
            return done
        cursors = [cursor for cursor, _remember in rows]
        wanted = [cursor for cursor, remember in rows if embed_all or remember]
        if wanted:
            embedding.embed_messages(session_ids=[session_id], cursors=wanted)
        log.mark_indexed(session_id, cursors)  # and full text where the append left none
        done += len(rows)
        if len(rows) < batch_size:
            return done
