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

Scheduling runs in the background (``services.background``): after each append commits, a
session whose tokens after its latest snapshot exceed ``SUMMARIZE_THRESHOLD_TOKENS`` is queued
for summarization, at most once at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..conf import memory_settings
from ..exceptions import EmptySummary, InvalidSnapshot, SnapshotConflict
from ..providers.summarizers import Summarizer, get_summarizer
from ..store import reads, snapshots
from ..store.snapshots import IDEMPOTENCY_KEY
from ..types import SnapshotView, StoredMessage
from ..validation import MAX_COUNT, check_keep_recent, check_snapshot
from . import embedding

logger = logging.getLogger(__name__)


# ---- choosing what to cover ------------------------------------------------------------------
def covered_range(
    tail: Sequence[StoredMessage], keep_recent: int, max_tokens: int | None = None
) -> list[StoredMessage]:
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
            answered = {m.tool_call_id for m in tail[start + 1 : cut]}
            if not asked <= answered:
                cut = start  # results still to come: leave the whole group out
    return list(tail[:cut])


# ---- compaction ------------------------------------------------------------------------------
def load(session_id) -> tuple[SnapshotView | None, list[StoredMessage]]:
    """``(latest snapshot or None, the messages after it)``: the state a summarizer starts from."""
    snapshot = snapshots.latest(session_id)
    return snapshot, reads.messages(session_id, after=snapshot.upto if snapshot else None)


def compact(
    session_id,
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
    keep_recent = check_keep_recent(keep_recent)
    attempts = max_attempts if max_attempts is not None else memory_settings.SUMMARIZE_MAX_ATTEMPTS
    if (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_COUNT
    ):
        raise InvalidSnapshot("max_attempts", f"must be a positive integer, not {attempts!r}")
    summarizer = summarizer if summarizer is not None else get_summarizer()
    conflict: SnapshotConflict | None = None
    for attempt in range(1, attempts + 1):
        if idempotency_key:
            done = snapshots.saved_under(session_id, idempotency_key)
            if done is not None:
                return done
        previous, tail = load(session_id)
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
            new = check_snapshot(
                summary.strip(),
                upto=covered[-1].cursor,
                prev=previous,
                pinned=previous.pinned if previous else (),
                model=getattr(summarizer, "model", "") or "",
                metadata=metadata,
            )
            if memory_settings.PRUNE_COMPACTED:
                embedding.promote_before_pruning(session_id, new.upto)
            return snapshots.save(session_id, new, prune=memory_settings.PRUNE_COMPACTED)
        except SnapshotConflict as err:
            conflict = err
            logger.info(
                "compaction of session %s lost a race (attempt %d/%d): %s",
                session_id,
                attempt,
                attempts,
                err,
            )
    assert conflict is not None
    raise conflict
