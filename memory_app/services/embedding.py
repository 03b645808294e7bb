"""Embedding messages for recall, and the per-model HNSW indexes.

Messages are embedded after their append commits (the append signal's receiver schedules it
through ``services.background``), by ``embed_session``, and by the ``memory_embed`` backfill.
All of them call ``embed_messages()`` here, which only embeds what is missing (unique message +
model, conflicts ignored): running it twice stores nothing twice.

Each embedding model gets its own HNSW index on PostgreSQL, created the first time the model
stores vectors: a partial expression index
``USING hnsw ((vector::vector(D)) vector_cosine_ops) WHERE model = '<name>'`` (``halfvec`` above
2000 dimensions, pgvector's limit for ``vector``). The column is untyped so models of different
sizes coexist; the cast gives the index a fixed size.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Exists, OuterRef

from ..conf import memory_settings
from ..encryption import decrypt_text
from ..exceptions import EmbedderError, InvalidSearch
from ..importance import should_recall
from ..models import Embedding, Message
from ..providers.embeddings import Embedder, get_embedder
from ..types import StoredMessage

logger = logging.getLogger(__name__)

#: pgvector indexes ``vector`` up to 2000 dimensions and ``halfvec`` up to 4000.
MAX_VECTOR_INDEX_DIMS = 2000
MAX_HALFVEC_INDEX_DIMS = 4000


def hnsw_index_name(model_name: str) -> str:
    """The index name for one embedding model: readable, unique, at most 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "_", model_name.lower()).strip("_")[:30]
    digest = hashlib.blake2b(model_name.encode(), digest_size=4).hexdigest()
    return f"memory_emb_hnsw_{slug}_{digest}"


def vector_type(dimensions: int) -> str:
    """The SQL type vectors of this size are cast to in their index and in queries."""
    if dimensions > MAX_VECTOR_INDEX_DIMS:
        return f"halfvec({int(dimensions)})"
    return f"vector({int(dimensions)})"


def sql_literal(value: str) -> str:
    # Partial-index predicates are matched against query literals, so the model name is inlined
    # (not bound) in both. standard_conforming_strings (on since PostgreSQL 9.1) makes doubling
    # quotes sufficient.
    if "\x00" in value:
        raise InvalidSearch("model", "must not contain NUL characters")
    return "'" + value.replace("'", "''") + "'"


def ensure_hnsw_index(model_name: str, dimensions: int, *, using: str | None = None) -> str | None:
    """Create the HNSW index for ``model_name`` if it does not exist; returns its name.

    Idempotent and safe when several workers race (an advisory lock serialises them). ``None``
    when the database is not PostgreSQL or the vectors are too long for any HNSW index.
    """
    using = using or router.db_for_write(Embedding)
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    if dimensions > MAX_HALFVEC_INDEX_DIMS:
        logger.warning(
            "%s: %d dimensions is too many for an HNSW index; owner-scope search will scan",
            model_name,
            dimensions,
        )
        return None
    index = hnsw_index_name(model_name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [index])
        if cursor.fetchone()[0]:
            return index
    ops = "halfvec_cosine_ops" if dimensions > MAX_VECTOR_INDEX_DIMS else "vector_cosine_ops"
    table = connection.ops.quote_name(Embedding._meta.db_table)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [index])
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {connection.ops.quote_name(index)} ON {table} "
            f"USING hnsw ((vector::{vector_type(dimensions)}) {ops}) "
            f"WITH (m = {int(memory_settings.HNSW_M)}, "
            f"ef_construction = {int(memory_settings.HNSW_EF_CONSTRUCTION)}) "
            f"WHERE model = {sql_literal(model_name)}"
        )
    logger.info("created HNSW index %s for %s (%d dimensions)", index, model_name, dimensions)
    return index


_EMBED_FIELDS = (
    "id",
    "session_id",
    "session__owner_id",
    "seq",
    "role",
    "content",
    "remember",
    "created_at",
)


def _pending(
    model_name: str,
    *,
    session_ids: Sequence | None = None,
    cursors: Sequence[int] | None = None,
    upto: int | None = None,
    replace: bool = False,
):
    qs = Message.objects.exclude(content="")  # nothing to embed (e.g. a bare tool call)
    if session_ids is not None:
        qs = qs.filter(session_id__in=list(session_ids))
    if cursors is not None:
        qs = qs.filter(seq__in=list(cursors))
    if upto is not None:
        qs = qs.filter(seq__lte=upto)
    if not replace:
        qs = qs.exclude(Exists(Embedding.objects.filter(message=OuterRef("pk"), model=model_name)))
    return qs


def _embeddable(rows: list[tuple], hook) -> list[tuple]:
    """The rows (``_EMBED_FIELDS``, content decrypted) the ``SHOULD_RECALL`` hook wants embedded."""
    return [
        row
        for row in rows
        if hook.for_message(
            StoredMessage(
                cursor=row[3], role=row[4], content=row[5] or "", remember=row[6], id=row[0]
            )
        )
    ]


def _decrypted(rows: list[tuple]) -> list[tuple]:
    # Embed the plaintext: with encryption at rest the column holds ciphertext.
    return [(*row[:5], decrypt_text(row[5] or ""), *row[6:]) for row in rows]


def count_missing(
    *,
    embedder: Embedder | None = None,
    session_ids: Sequence | None = None,
    batch_size: int | None = None,
) -> int:
    """Messages ``embed_messages`` would embed: without a vector from ``embedder`` (the
    configured one by default) and wanted by the ``SHOULD_RECALL`` hook. Messages it declines
    (no text, bare acknowledgements) are never embedded, so they are not counted as pending.

    The hook is Python, so this reads the pending rows (in batches, content only): the cost of
    the backfill's own first pass, not of a ``COUNT``.
    """
    embedder = embedder or get_embedder()
    batch_size = int(batch_size or memory_settings.EMBED_BATCH_SIZE)
    hook = should_recall()
    qs = _pending(embedder.name, session_ids=session_ids)
    total, last_id = 0, 0
    while True:
        batch = list(
            qs.filter(id__gt=last_id).order_by("id").values_list(*_EMBED_FIELDS)[:batch_size]
        )
        if not batch:
            return total
        last_id = batch[-1][0]
        total += len(_embeddable(_decrypted(batch), hook))


def embed_messages(
    *,
    session_ids: Sequence | None = None,
    cursors: Sequence[int] | None = None,
    upto: int | None = None,
    replace: bool = False,
    embedder: Embedder | None = None,
    batch_size: int | None = None,
    limit: int | None = None,
    progress: Callable[[int], Any] | None = None,
) -> int:
    """Embed the messages that have no vector from ``embedder`` yet; returns how many vectors
    were written (a concurrent run embedding the same messages may have written some first).

    ``session_ids`` / ``cursors`` / ``upto`` (cursors up to it) narrow the messages (cursors
    only make sense with one session). ``replace`` re-embeds messages that already have a
    vector (each batch's old
    vectors are swapped for new ones in one transaction). Work goes in batches of
    ``batch_size`` messages, each committed on its own, so an interrupted run loses at most one
    batch and the next run continues with what is still missing. Messages the
    ``SHOULD_RECALL`` hook declines (no text, bare acknowledgements) are skipped and not
    counted: ``limit`` stops after that many embeddable messages, ``progress(n)`` is called
    after each batch with the embeddable ones it held (what ``count_missing`` counts).
    """
    embedder = embedder or get_embedder()
    batch_size = int(batch_size or memory_settings.EMBED_BATCH_SIZE)
    hook = should_recall()
    qs = _pending(
        embedder.name, session_ids=session_ids, cursors=cursors, upto=upto, replace=replace
    )
    using = router.db_for_write(Embedding)
    index_checked = False
    stored = seen = 0
    last_id = 0
    while limit is None or seen < limit:
        take = batch_size if limit is None else min(batch_size, limit - seen)
        batch = list(qs.filter(id__gt=last_id).order_by("id").values_list(*_EMBED_FIELDS)[:take])
        if not batch:
            break
        last_id = batch[-1][0]
        wanted = _embeddable(_decrypted(batch), hook)
        seen += len(wanted)
        if wanted:
            vectors = embedder.embed([row[5] or "" for row in wanted])
            dims = len(vectors[0])
            if not index_checked:
                ensure_hnsw_index(embedder.name, dims, using=using)
                index_checked = True
            objs = [
                Embedding(
                    message_id=row[0],
                    session_id=row[1],
                    owner_id=row[2],
                    cursor=row[3],
                    role=row[4],
                    message_created_at=row[7],
                    model=embedder.name,
                    dimensions=dims,
                    vector=vector,
                )
                for row, vector in zip(wanted, vectors, strict=True)
            ]
            with transaction.atomic(using=using):
                if replace:
                    Embedding.objects.filter(
                        message_id__in=[r[0] for r in wanted], model=embedder.name
                    ).delete()
                created = Embedding.objects.bulk_create(objs, ignore_conflicts=True)
            stored += len(created)
        if progress:
            progress(len(wanted))
    return stored


def promote_before_pruning(session_id, upto: int) -> int:
    """Long-term memory first, then pruning: embed the messages up to ``upto`` that appends
    would have embedded (``EMBED_ON_APPEND``) but that have no vector yet (their task has not
    run, or failed), so pruning them keeps them recallable. Remembered messages are never
    pruned. Idempotent (one vector per session, cursor and model); returns how many were
    stored. An embedder failure is logged and leaves those messages unpromoted: pruning goes
    on (the summary still stands for them)."""
    if not memory_settings.EMBED_ON_APPEND:
        return 0
    try:
        return embed_messages(session_ids=[session_id], upto=upto)
    except EmbedderError:
        logger.exception(
            "could not embed the messages of session %s before pruning them", session_id
        )
        return 0
