"""An owner's items, searchable: the rule book's checks, embedding, and hybrid search.

``put`` checks the item, embeds its text (the text the caller chose to index: whole value or
some fields) with an embedder (the configured one unless the caller brings its own, as a
LangGraph ``index`` config does) and stores it; ``search`` filters an owner's live items by
namespace prefix and value conditions, then ranks them by a query the way message recall does:
vector similarity and PostgreSQL full text, fused by the same ``FUSION`` settings (CombSUM of
per-query normalised scores by default). Without a query, newest first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db import connections
from django.db.models import F
from pgvector.django import CosineDistance

from ..conf import memory_settings
from ..exceptions import InvalidItem
from ..models import Item
from ..providers.embeddings import get_embedder
from ..store import items
from ..store.pending import FULLTEXT_CONFIG
from ..validation import (
    MODES,
    check_count,
    check_item_filter,
    check_item_key,
    check_item_namespace,
    check_item_value,
    check_ttl,
    unstorable,
)
from . import fusion
from .fusion import fusion_config
from .text import query_terms


class ItemEmbedder(Protocol):
    """What embeds items: ``name`` (stored with each vector), ``embed(texts)`` and
    ``embed_query(text)``; the configured embedder is one."""

    name: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def put(
    owner: Any,
    namespace: Any,
    key: Any,
    value: Any,
    *,
    ttl: Any = None,
    text: str | None,
    embedder: ItemEmbedder | None = None,
    kind: str = "item",
    session_id: Any = None,
    source_cursors: Sequence[int] = (),
) -> Item:
    """Check and store an item; ``text`` is what search finds it by (``None``: not indexed)."""
    namespace = check_item_namespace(namespace)
    key = check_item_key(key)
    value = check_item_value(value)
    ttl = check_ttl(ttl)
    vector, model = None, ""
    if text:
        if problem := unstorable(text):
            raise InvalidItem("value", problem)
        embedder = embedder or get_embedder()
        vector, model = embedder.embed([text])[0], embedder.name
    return items.put(
        owner,
        namespace,
        key,
        value,
        ttl_minutes=ttl,
        text=text,
        vector=vector,
        model=model,
        kind=kind,
        session_id=session_id,
        source_cursors=source_cursors,
    )


def get(owner: Any, namespace: Any, key: Any, *, refresh: bool = True) -> Item | None:
    return items.get(owner, check_item_namespace(namespace), check_item_key(key), refresh=refresh)


def delete(owner: Any, namespace: Any, key: Any) -> int:
    return items.delete(owner, check_item_namespace(namespace), check_item_key(key))


def list_namespaces(
    owner: Any,
    conditions: Sequence[tuple[str, Any]] = (),
    *,
    max_depth: Any = None,
    limit: Any = 100,
    offset: Any = 0,
) -> list[tuple[str, ...]]:
    checked = []
    for match_type, path in conditions:
        if match_type not in ("prefix", "suffix"):
            raise InvalidItem("match_type", f"must be 'prefix' or 'suffix', not {match_type!r}")
        checked.append((match_type, check_item_namespace(path, field=match_type, wildcard=True)))
    return items.namespaces(
        owner,
        checked,
        max_depth=None if max_depth is None else check_count(max_depth, "max_depth"),
        limit=check_count(limit, "limit"),
        offset=check_count(offset, "offset"),
    )


def _vector_ranking(qs, query: str, embedder: ItemEmbedder, limit: int) -> list[tuple[Any, float]]:
    return nearest(qs, embedder.embed_query(query), embedder.name, limit=limit)


def nearest(qs, vector: list[float], model: str, *, limit: int) -> list[tuple[Any, float]]:
    """``(pk, cosine similarity)`` of the items of ``qs`` whose vectors (of ``model``) lie
    nearest to ``vector``, nearest first."""
    qs = qs.filter(embedding_model=model, vector__isnull=False)
    if connections[qs.db].vendor == "postgresql":
        hits = (
            qs.annotate(distance=CosineDistance("vector", vector))
            .order_by("distance", "-updated_at")
            .values_list("pk", "distance")[:limit]
        )
        return [(pk, 1.0 - float(distance)) for pk, distance in hits]
    scored = []
    for pk, stored in qs.values_list("pk", "vector"):
        norm = math.sqrt(sum(x * x for x in stored)) * math.sqrt(sum(x * x for x in vector))
        scored.append(
            (pk, sum(a * b for a, b in zip(stored, vector, strict=False)) / norm if norm else 0.0)
        )
    return sorted(scored, key=lambda hit: -hit[1])[:limit]


def _fulltext_ranking(qs, query: str, limit: int) -> list[tuple[Any, float]]:
    terms = sorted(query_terms(query))
    if not terms or connections[qs.db].vendor != "postgresql":
        return []
    tsquery = SearchQuery(
        " | ".join(terms), search_type="raw", config=FULLTEXT_CONFIG
    )  # any query word
    hits = (
        qs.filter(search_vector=tsquery)
        .annotate(rank=SearchRank(F("search_vector"), tsquery))
        .order_by("-rank", "-updated_at")
        .values_list("pk", "rank")[:limit]
    )
    return [(pk, float(rank)) for pk, rank in hits]


def search(
    owner: Any,
    prefix: Any = (),
    *,
    query: Any = None,
    filter: Any = None,
    limit: Any = 10,
    offset: Any = 0,
    refresh: bool = True,
    mode: str | None = None,
    embedder: ItemEmbedder | None = None,
) -> list[tuple[Item, float | None]]:
    """``(item, score)`` of the owner's live items under ``prefix`` matching ``filter``: ranked
    by ``query`` (score: the fused score) or newest first (score ``None``)."""
    prefix = check_item_namespace(prefix, field="namespace_prefix", empty=True)
    conditions = check_item_filter(filter)
    limit, offset = check_count(limit, "limit"), check_count(offset, "offset")
    if query is not None and (not isinstance(query, str) or unstorable(query)):
        raise InvalidItem("query", "must be a string")
    mode = memory_settings.SEARCH_MODE if mode is None else mode
    if mode not in MODES:
        raise InvalidItem("mode", f"must be one of {', '.join(MODES)}, not {mode!r}")
    qs = items.matching(items.under(items.owned(owner), prefix), conditions)
    if not query:
        found = [(item, None) for item in items.order_by_recency(qs)[offset : offset + limit]]
    else:
        page = rank(qs, query, mode=mode, limit=offset + limit, embedder=embedder)[offset:]
        by_pk = Item.objects.using(qs.db).in_bulk([pk for pk, _ in page])
        found = [(by_pk[pk], score) for pk, score in page if pk in by_pk]
    if refresh:
        items.refresh_expiry([item for item, _ in found])
    return found


def rank(
    qs, query: str, *, mode: str, limit: int, embedder: ItemEmbedder | None = None
) -> list[tuple[Any, float]]:
    """``(pk, score)`` of the items of ``qs`` best matching ``query``, best first: vectors and
    full text fused as message recall fuses them (``mode`` picks one or both)."""
    embedder = embedder or get_embedder()
    candidates = max(limit, memory_settings.HYBRID_CANDIDATES)
    rankings = {}
    if mode in ("hybrid", "vector"):
        rankings["vector"] = _vector_ranking(qs, query, embedder, candidates)
    if mode in ("hybrid", "fulltext"):
        rankings["fulltext"] = _fulltext_ranking(qs, query, candidates)
    config = fusion_config()
    if len(rankings) == 1:
        ranked = next(iter(rankings.values()))
    else:
        weights = {"vector": config.vector_weight, "fulltext": 1.0 - config.vector_weight}
        ranked = fusion.combsum(rankings, weights=weights, method=config.normalisation)
    return ranked[:limit]
