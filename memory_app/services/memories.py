"""Memory of what was learned: facts about an owner, with provenance and time.

A memory is a store item of kind ``memory`` under the namespace ``("memories",)``: its text
(``value["text"]``, with optional ``metadata`` and ``topic``), the session and message cursors
it came from, an importance from 0 to 1, and the time it was in force. The rules:

- **Superseded, not overwritten.** Updating a memory adds a new version of its key, in force
  from now; the version before ends now (``invalid_at``) and stays readable: ``history(key)``
  lists every version, and ``current(as_of=t)`` / ``search(as_of=t)`` answer what was known at
  ``t``. Nothing learned is deleted except by the owner (``forget``, an erase).
- **The same fact is kept once.** A new fact whose vector is at least
  ``MEMORY_DUPLICATE_SIMILARITY`` similar to a current memory's confirms that memory (its
  confirmation count and importance go up) instead of being stored again.
- **A cap per owner.** At most ``MEMORIES_PER_OWNER`` memories are current. Past it the least
  important current memory is evicted (its version ends, ``ended="evicted"``), the oldest first
  among equals; a memory with no importance counts as 0. An explicit ``remember`` has
  importance 1 unless given one, so what a person or agent asked to keep goes last.

Extraction (``services.extraction``) feeds this service; the memory tools, the API and the
facade call it too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import router, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidItem
from ..models import Item
from ..providers.embeddings import get_embedder
from ..store import items
from ..store.filters import item_q
from ..types import MemoryView
from ..validation import (
    MAX_SEARCH_LIMIT,
    MODES,
    check_count,
    check_datetime,
    check_importance,
    check_memory_metadata,
    check_memory_text,
    check_recall_filters,
    check_search,
)
from . import items as item_search

NAMESPACE = ("memories",)
KIND = Item.MEMORY
#: Importance of a fact someone asked to keep, when they gave none.
EXPLICIT_IMPORTANCE = 1.0


def view(item: Item, score: float | None = None) -> MemoryView:
    value = item.value or {}
    return MemoryView(
        key=item.key,
        text=str(value.get("text", "")),
        importance=item.importance,
        valid_from=item.valid_from,
        invalid_at=item.invalid_at,
        session_id=item.session_id,
        source_cursors=tuple(item.source_cursors or ()),
        metadata=dict(value.get("metadata") or {}),
        topic=str(value.get("topic") or ""),
        ended=str(value.get("ended") or ""),
        confirmations=int(value.get("confirmations") or 0),
        id=item.pk,
        score=score,
    )


def _memories(owner: Any) -> QuerySet:
    """Every version of every memory of ``owner``."""
    return items.of_owner(owner).filter(kind=KIND, namespace=items.joined(NAMESPACE))


def _as_of(value: Any) -> dt.datetime | None:
    return None if value is None else check_datetime(value, "as_of", InvalidItem)


def _value(text: str, metadata: dict, topic: str | None, confirmations: int = 0) -> dict:
    value: dict[str, Any] = {"text": text}
    if metadata:
        value["metadata"] = metadata
    if topic:
        value["topic"] = topic
    if confirmations:
        value["confirmations"] = confirmations
    return value


def _check_topic(topic: Any) -> str | None:
    if topic is None or topic == "":
        return None
    if not isinstance(topic, str) or len(topic) > 100:
        raise InvalidItem("topic", "must be a string of at most 100 characters")
    check_memory_text(topic, "topic")
    return topic


# ---- writing ---------------------------------------------------------------------------------
def remember(
    owner: Any,
    text: Any,
    *,
    metadata: Any = None,
    topic: Any = None,
    importance: Any = None,
    session_id: Any = None,
    cursors: Sequence[int] = (),
    vector: list[float] | None = None,
    now: dt.datetime | None = None,
) -> tuple[MemoryView, bool]:
    """Keep a fact about ``owner``; ``(memory, whether it is new)``. The same fact already
    current (``MEMORY_DUPLICATE_SIMILARITY``) is confirmed instead. ``vector``: the text's, when
    the caller embedded it already (extraction embeds a batch at once)."""
    text = check_memory_text(text)
    metadata = check_memory_metadata(metadata)
    topic = _check_topic(topic)
    importance = check_importance(importance)
    if importance is None:
        importance = EXPLICIT_IMPORTANCE
    embedder = get_embedder()
    if vector is None:
        vector = embedder.embed([text])[0]
    now = now or timezone.now()
    with transaction.atomic(using=router.db_for_write(Item)):
        same = _duplicate_of(owner, vector, embedder.name)
        if same is not None:
            value = {**same.value, "confirmations": int(same.value.get("confirmations") or 0) + 1}
            if metadata:
                value["metadata"] = {**(same.value.get("metadata") or {}), **metadata}
            best = max(importance, same.importance or 0.0)
            items.touch(same, value, best, now)
            same.value, same.importance = value, best
            return view(same), False
        item = items.add_version(
            owner,
            NAMESPACE,
            uuid.uuid4().hex,
            _value(text, metadata, topic),
            text=text,
            vector=vector,
            model=embedder.name,
            kind=KIND,
            session_id=session_id,
            source_cursors=cursors,
            importance=importance,
            now=now,
        )
        _enforce_cap(owner, now)
    return view(item), True


def update(
    owner: Any,
    key: Any,
    text: Any,
    *,
    metadata: Any = None,
    topic: Any = None,
    importance: Any = None,
    session_id: Any = None,
    cursors: Sequence[int] = (),
    vector: list[float] | None = None,
    now: dt.datetime | None = None,
) -> MemoryView:
    """Supersede the current version of memory ``key`` with ``text`` (the old version ends now
    and stays in the history). Metadata, topic and importance carry over unless given."""
    text = check_memory_text(text)
    current = _current_version(owner, key)
    old = current.value or {}
    metadata = check_memory_metadata(old.get("metadata") if metadata is None else metadata)
    topic = _check_topic(old.get("topic") if topic is None else topic)
    importance = check_importance(importance)
    embedder = get_embedder()
    if vector is None:
        vector = embedder.embed([text])[0]
    item = items.add_version(
        owner,
        NAMESPACE,
        current.key,
        _value(text, metadata, topic),
        text=text,
        vector=vector,
        model=embedder.name,
        kind=KIND,
        session_id=session_id,
        source_cursors=cursors,
        importance=current.importance if importance is None else importance,
        now=now,
    )
    return view(item)


def forget(owner: Any, key: Any) -> int:
    """End the current version of memory ``key`` (``ended="retired"``); the history stays.
    Returns how many versions ended (0 or 1)."""
    now = timezone.now()
    with transaction.atomic(using=router.db_for_write(Item)):
        current = list(
            _memories(owner).filter(key=_key(key), invalid_at__isnull=True).select_for_update()
        )
        return items.end(current, now, "retired")


def _key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > 255:
        raise InvalidItem("key", "must be a memory's key")
    return key


def _current_version(owner: Any, key: Any) -> Item:
    current = _memories(owner).filter(key=_key(key), invalid_at__isnull=True).first()
    if current is None:
        raise InvalidItem("key", f"no current memory {key!r}")
    return current


def _duplicate_of(owner: Any, vector: list[float], model: str) -> Item | None:
    """The current memory of ``owner`` most similar to ``vector``, if it is the same fact."""
    threshold = float(memory_settings.MEMORY_DUPLICATE_SIMILARITY)
    best = item_search.nearest(
        _memories(owner).filter(invalid_at__isnull=True), vector, model, limit=1
    )
    if best and best[0][1] >= threshold:
        return Item.objects.filter(pk=best[0][0]).select_for_update().first()
    return None


def _enforce_cap(owner: Any, now: dt.datetime) -> int:
    """Evict the least important current memories past ``MEMORIES_PER_OWNER``."""
    current = _memories(owner).filter(invalid_at__isnull=True)
    over = current.count() - int(memory_settings.MEMORIES_PER_OWNER)
    if over <= 0:
        return 0
    doomed = list(
        current.order_by(
            F("importance").asc(nulls_first=True), "valid_from", "created_at"
        ).select_for_update()[:over]
    )
    return items.end(doomed, now, "evicted")


# ---- reading ---------------------------------------------------------------------------------
def current(
    owner: Any,
    *,
    as_of: Any = None,
    filters: Any = None,
    limit: Any = 100,
    offset: Any = 0,
) -> list[MemoryView]:
    """The owner's memories in force now (or at ``as_of``), newest first."""
    qs = _in_force(owner, _as_of(as_of), filters)
    limit, offset = check_count(limit, "limit"), check_count(offset, "offset")
    if not 1 <= limit <= MAX_SEARCH_LIMIT:
        raise InvalidItem("limit", f"must be from 1 to {MAX_SEARCH_LIMIT}")
    return [view(i) for i in qs.order_by("-valid_from", "-created_at")[offset : offset + limit]]


def count(owner: Any) -> int:
    return _memories(owner).filter(invalid_at__isnull=True).count()


def history(owner: Any, key: Any) -> list[MemoryView]:
    """Every version of memory ``key``, oldest first (empty for another owner's key)."""
    return [view(i) for i in _memories(owner).filter(key=_key(key)).order_by("valid_from")]


def search(
    owner: Any,
    query: Any,
    *,
    limit: Any = 5,
    as_of: Any = None,
    filters: Any = None,
    mode: str | None = None,
) -> list[MemoryView]:
    """The owner's memories in force now (or at ``as_of``) best matching ``query``."""
    query, limit, _scope, _roles, mode = check_search(query, limit, "owner", None, mode)
    if mode not in MODES:
        raise InvalidItem("mode", f"must be one of {', '.join(MODES)}")
    qs = _in_force(owner, _as_of(as_of), filters)
    ranked = item_search.rank(qs, query, mode=mode, limit=limit)
    by_pk = Item.objects.in_bulk([pk for pk, _ in ranked])
    return [view(by_pk[pk], score) for pk, score in ranked if pk in by_pk]


def _in_force(owner: Any, as_of: dt.datetime | None, filters: Any) -> QuerySet:
    qs = _memories(owner)
    qs = items.in_force(qs, as_of) if as_of is not None else qs.filter(invalid_at__isnull=True)
    filters = check_recall_filters(filters)
    if filters:
        qs = qs.filter(item_q(filters))
    return qs
