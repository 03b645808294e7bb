"""Learning from new messages: the extractor (``MEMORY_EXTRACTOR``) reads a session's messages
in batches and what it finds becomes the owner's memories (``services.memories``).

- **Batched per session.** ``Session.extracted_upto`` is the cursor of the last message read.
  The after-append job starts an extraction once ``MEMORY_EXTRACT_BATCH`` messages wait (at once
  when one of them is remembered); a run reads at most ``MEMORY_EXTRACT_MAX_MESSAGES`` at a time
  and goes on until none waits. Ownerless sessions teach nothing: they have no one to learn
  about.
- **Idempotent.** The extractor runs outside any transaction (a model call takes seconds); its
  operations are then applied, and ``extracted_upto`` moved, in one transaction that holds the
  session's row lock and checks that ``extracted_upto`` is still where the run started
  (compare-and-swap). A redelivered or concurrent run finds it moved and applies nothing; a run
  that dies before its commit leaves nothing behind, and the next one reads the same batch.
- **Cheap.** One extractor call per batch (the OpenAI extractor: one chat completion), one
  embedder call for all the facts of a batch, and the owner's memories most related to the batch
  given to the extractor so it can update one rather than contradict it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import router, transaction

from ..conf import memory_settings
from ..exceptions import InvalidItem
from ..models import Message, Session
from ..providers.embeddings import get_embedder
from ..providers.extractors import Extractor
from ..store import reads
from ..validation import MAX_QUERY_CHARS
from . import memories

logger = logging.getLogger(__name__)

#: Current memories handed to the extractor with each batch (the most related to it).
RELATED_MEMORIES = 20


@memory_settings.derived
def get_extractor() -> Extractor | None:
    """The configured extractor (``MEMORY_EXTRACTOR``), or ``None``: nothing is extracted."""
    cls = memory_settings.MEMORY_EXTRACTOR
    return None if cls is None else cls(**memory_settings.MEMORY_EXTRACTOR_OPTIONS)


def needs_extraction(session_id) -> bool:
    """Whether a batch of the session waits: ``MEMORY_EXTRACT_BATCH`` messages, or a
    remembered one (an owner's session, an extractor configured)."""
    if get_extractor() is None:
        return False
    row = (
        Session.objects.filter(pk=session_id)
        .values_list("owner_id", "extracted_upto", "next_seq")
        .first()
    )
    if row is None or row[0] is None:
        return False
    _owner, upto, next_seq = row
    waiting = next_seq - 1 - upto
    if waiting >= int(memory_settings.MEMORY_EXTRACT_BATCH):
        return True
    return waiting > 0 and (
        Message.objects.filter(session_id=session_id, seq__gt=upto, remember=True).exists()
    )


def extract(session_id, *, max_batches: int | None = None) -> dict[str, Any] | None:
    """Read the session's waiting messages batch by batch and keep what the extractor finds.
    Returns counts (``read``, ``added``, ``updated``, ``confirmed``, ``batches``), or ``None``
    when there is no extractor, no such session or no owner."""
    extractor = get_extractor()
    if extractor is None:
        return None
    totals = {"read": 0, "added": 0, "updated": 0, "confirmed": 0, "batches": 0}
    while max_batches is None or totals["batches"] < max_batches:
        row = Session.objects.filter(pk=session_id).values_list("owner_id", "extracted_upto")
        row = row.first()
        if row is None or row[0] is None:
            return None if not totals["batches"] else totals
        owner_id, upto = row
        batch = reads.messages(
            session_id, after=upto, limit=int(memory_settings.MEMORY_EXTRACT_MAX_MESSAGES)
        )
        if not batch:
            break
        done = _extract_batch(extractor, session_id, owner_id, upto, batch)
        if done is None:  # another run read this batch meanwhile: it is theirs
            break
        totals["batches"] += 1
        for key, value in done.items():
            totals[key] += value
    return totals


def _extract_batch(extractor: Extractor, session_id, owner_id, upto: int, batch) -> dict | None:
    said = " ".join(m.content for m in batch if m.role == "user" and m.content)
    related = (
        memories.search(owner_id, said[:MAX_QUERY_CHARS], limit=RELATED_MEMORIES)
        if said.strip()
        else []
    )
    ops = extractor.extract(batch, related)
    vectors = get_embedder().embed([op.text for op in ops]) if ops else []
    counts = {"read": len(batch), "added": 0, "updated": 0, "confirmed": 0}
    with transaction.atomic(using=router.db_for_write(Session)):
        locked = (
            Session.objects.select_for_update()
            .filter(pk=session_id, extracted_upto=upto)
            .values_list("pk", flat=True)
        )
        if not locked:
            return None
        for op, vector in zip(ops, vectors, strict=True):
            common = {
                "importance": op.importance,
                "metadata": op.metadata or None,
                "session_id": session_id,
                "cursors": op.cursors,
                "vector": vector,
            }
            if op.action == "update":
                try:
                    memories.update(owner_id, op.key, op.text, **common)
                    counts["updated"] += 1
                    continue
                except InvalidItem:  # retired or updated meanwhile: a fact of its own
                    pass
            _memory, new = memories.remember(owner_id, op.text, **common)
            counts["added" if new else "confirmed"] += 1
        Session.objects.filter(pk=session_id).update(extracted_upto=batch[-1].cursor)
    logger.info(
        "extracted session %s up to #%s with %s: %s",
        session_id,
        batch[-1].cursor,
        extractor.name or type(extractor).__name__,
        counts,
    )
    return counts
