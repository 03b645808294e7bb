"""What follows an append: indexing new messages for recall, off the request path.

An append writes its rows and nothing else: each row carries ``index_pending`` (the column's
default). ``index_new_messages()`` is the one job that catches up with a session: it embeds the
pending messages recall wants vectors of (all of them with ``EMBED_ON_APPEND``, the remembered
ones otherwise, less what ``SHOULD_RECALL`` declines), in batches of ``EMBED_BATCH_SIZE`` (one
embedder call per batch, not per message), then fills their full-text vectors and clears the
mark in one UPDATE, and last checks the summarize threshold. Messages that want no vector (not
remembered, ``EMBED_ON_APPEND`` off) get theirs in a single statement on PostgreSQL, with no
look-up first. ``services.background`` runs it (a
Celery task, or in this process with no broker) at most once per session at a time; the sweeps
find the sessions whose job never ran.

Every step is idempotent: a vector is computed once (``COALESCE``), an embedding is
stored once (unique per session, cursor and model), the mark is cleared once. So a job that runs
twice, or two at once, stores nothing twice, and a job that dies half-way leaves its messages
marked for the next one. Full-text search reads pending messages through the same expression,
so nothing is missing from recall while the job is queued.
"""

from __future__ import annotations

import logging

from ..conf import memory_settings
from ..store import pending
from . import embedding

logger = logging.getLogger(__name__)

#: Messages given full-text vectors per statement when none of them wants an embedding (no
#: embedder call to size a batch for: only the length of one transaction).
PLAIN_BATCH = 1000


def index_new_messages(session_id) -> int:
    """Index the session's pending messages for recall; returns how many were indexed.

    Raises what the embedder raises (``EmbedderError``): the messages stay marked, so a retry
    or the sweep picks them up.
    """
    batch_size = int(memory_settings.EMBED_BATCH_SIZE)
    embed_all = memory_settings.EMBED_ON_APPEND
    done = 0
    if not embed_all:
        # Only remembered messages want vectors: the others are done in one statement each
        # batch, and the loop below is left with the remembered ones, if any.
        while (result := pending.index_without_vectors(session_id, PLAIN_BATCH)) is not None:
            indexed, remembered_waiting = result
            done += indexed
            if indexed < PLAIN_BATCH:
                if not remembered_waiting:
                    return done
                break
    while True:
        rows = pending.pending_index(session_id, batch_size)
        if not rows:
            return done
        cursors = [cursor for cursor, _remember in rows]
        wanted = [cursor for cursor, remember in rows if embed_all or remember]
        if wanted:
            embedding.embed_messages(session_ids=[session_id], cursors=wanted)
        # Full text and the mark last, in one UPDATE: an embedder error leaves both for the
        # retry (full-text search matches unindexed rows by the same expression meanwhile).
        pending.mark_indexed(session_id, cursors)
        done += len(rows)
        if len(rows) < batch_size:
            return done
