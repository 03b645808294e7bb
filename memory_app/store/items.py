"""An owner's items: values kept under a namespace (a tuple of labels) and a key.

This is LangGraph's ``BaseStore`` data (``integrations.langgraph.DjangoStore``) and the place
learned memories will live: the model keeps provenance and validity times. Rules kept here:

- Every query starts from one owner's items (``None``: the ownerless ones): another owner's item
  is simply not found.
- A namespace is stored as its labels joined by ``.`` (the rule book refuses labels with a dot,
  NUL or nothing in them), so a prefix matches at label boundaries only: ``("foo",)`` covers
  ``foo`` and ``foo.*``, never ``foobar``.
- Expired items are never read (``expires_at`` passed), whether or not a sweep has deleted them;
  reading with ``refresh`` moves the expiry of the live ones read by their own TTL.
- Only one version of a key is in force (``invalid_at`` is null): ``put`` updates it in place.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib.postgres.search import SearchVector
from django.db import connections, router, transaction
from django.db.models import F, Q, QuerySet, Value
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from ..models import Item
from . import sessions

SEPARATOR = "."
#: Filter operators on an item's top-level value keys.
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
WILDCARD = "*"


def _write_db() -> str:
    return router.db_for_write(Item)


def joined(namespace: Sequence[str]) -> str:
    return SEPARATOR.join(namespace)


def split(namespace: str) -> tuple[str, ...]:
    return tuple(namespace.split(SEPARATOR)) if namespace else ()


def owned(owner: Any, now: dt.datetime | None = None) -> QuerySet:
    """The live items of ``owner`` (current versions, not expired)."""
    return Item.objects.for_owner(sessions.owner_id(owner)).current(now)


def under(qs: QuerySet, prefix: Sequence[str]) -> QuerySet:
    """Items whose namespace is ``prefix`` or lies below it (label boundaries only)."""
    if not prefix:
        return qs
    text = joined(prefix)
    return qs.filter(Q(namespace=text) | Q(namespace__startswith=text + SEPARATOR))


def matching(qs: QuerySet, conditions: dict[str, Any]) -> QuerySet:
    """Items whose value matches every condition: ``{key: value}`` (equal), or ``{key: {"$gt":
    n, ...}}`` with the operators in ``OPERATORS`` (checked by the rule book first)."""
    for index, (key, wanted) in enumerate(conditions.items()):
        alias = f"_value_{index}"
        qs = qs.alias(**{alias: KeyTransform(key, "value")})
        tests = (
            wanted
            if isinstance(wanted, dict) and wanted and all(k in OPERATORS for k in wanted)
            else {"$eq": wanted}
        )
        for operator, operand in tests.items():
            if operator == "$eq":
                qs = qs.filter(**{alias: operand})
            elif operator == "$ne":
                qs = qs.exclude(**{alias: operand})
            else:
                qs = qs.filter(**{f"{alias}__{operator[1:]}": operand})
    return qs


def get(owner: Any, namespace: Sequence[str], key: str, *, refresh: bool) -> Item | None:
    now = timezone.now()
    item = owned(owner, now).filter(namespace=joined(namespace), key=key).first()
    if item is not None and refresh:
        refresh_expiry([item], now)
    return item


def refresh_expiry(items: Iterable[Item], now: dt.datetime | None = None) -> None:
    """Move the expiry of live items with a TTL to ``now + ttl`` (refresh on read)."""
    with_ttl = [item for item in items if item.ttl_minutes is not None]
    if not with_ttl:
        return
    now = now or timezone.now()
    for item in with_ttl:
        item.expires_at = now + dt.timedelta(minutes=item.ttl_minutes)
    Item.objects.bulk_update(with_ttl, ["expires_at"])


def put(
    owner: Any,
    namespace: Sequence[str],
    key: str,
    value: dict,
    *,
    ttl_minutes: float | None,
    text: str | None,
    vector: list[float] | None,
    model: str,
    kind: str = "item",
    session_id: Any = None,
    source_cursors: Sequence[int] = (),
) -> Item:
    """Store ``value`` under the key (updating the version in force), with its search text
    (``None``: not searchable) and vector."""
    now = timezone.now()
    owner_pk = sessions.owner_id(owner)
    ns = joined(namespace)
    fields = {
        "value": value,
        "updated_at": now,
        "ttl_minutes": ttl_minutes,
        "expires_at": None if ttl_minutes is None else now + dt.timedelta(minutes=ttl_minutes),
        "vector": vector,
        "embedding_model": model if vector is not None else "",
        "kind": kind,
        "session_id": session_id,
        "source_cursors": list(source_cursors),
    }
    with transaction.atomic(using=_write_db()):
        current = Item.objects.for_owner(owner_pk).filter(
            namespace=ns, key=key, invalid_at__isnull=True
        )
        item = current.select_for_update().first()
        if item is None:
            item = Item.objects.create(owner_id=owner_pk, namespace=ns, key=key, **fields)
        else:
            for name, field_value in fields.items():
                setattr(item, name, field_value)
            item.save(update_fields=list(fields))
        _index_text(item.pk, text)
    return item


def _index_text(pk, text: str | None) -> None:
    """The item's full-text vector (PostgreSQL; elsewhere search scans the value)."""
    if connections[_write_db()].vendor == "postgresql":
        search_vector = SearchVector(Value(text), config="english") if text else None
        Item.objects.filter(pk=pk).update(search_vector=search_vector)


# -- versions: a value superseded, not overwritten ---------------------------------------------
def in_force(qs: QuerySet, when: dt.datetime) -> QuerySet:
    """The versions in force at ``when``: valid from then or earlier, not ended by then."""
    return qs.filter(valid_from__lte=when).filter(
        Q(invalid_at__isnull=True) | Q(invalid_at__gt=when)
    )


def of_owner(owner: Any) -> QuerySet:
    """Every version of every item of ``owner`` (current, past and expired alike)."""
    return Item.objects.for_owner(sessions.owner_id(owner))


def add_version(
    owner: Any,
    namespace: Sequence[str],
    key: str,
    value: dict,
    *,
    text: str | None,
    vector: list[float] | None,
    model: str,
    kind: str,
    session_id: Any = None,
    source_cursors: Sequence[int] = (),
    importance: float | None = None,
    now: dt.datetime | None = None,
    ended: str = "superseded",
) -> Item:
    """A new version of the key, in force from ``now``; the version in force until then ends
    at ``now`` (kept, with ``value["ended"] = ended``). Never updates in place."""
    now = now or timezone.now()
    owner_pk = sessions.owner_id(owner)
    ns = joined(namespace)
    with transaction.atomic(using=_write_db()):
        current = list(
            Item.objects.for_owner(owner_pk)
            .filter(namespace=ns, key=key, invalid_at__isnull=True)
            .select_for_update()
        )
        end(current, now, ended)
        item = Item.objects.create(
            owner_id=owner_pk,
            namespace=ns,
            key=key,
            value=value,
            kind=kind,
            session_id=session_id,
            source_cursors=list(source_cursors),
            importance=importance,
            valid_from=now,
            updated_at=now,
            vector=vector,
            embedding_model=model if vector is not None else "",
        )
        _index_text(item.pk, text)
    return item


def end(versions: Iterable[Item], now: dt.datetime, reason: str) -> int:
    """End these versions at ``now`` (``invalid_at``), saying why in ``value["ended"]``; call
    with their rows locked. Returns how many ended."""
    ended = []
    for item in versions:
        item.invalid_at = now
        item.value = {**item.value, "ended": reason}
        ended.append(item)
    if ended:
        Item.objects.bulk_update(ended, ["invalid_at", "value"])
    return len(ended)


def touch(item: Item, value: dict, importance: float | None, now: dt.datetime) -> None:
    """Update a version's value and importance in place (a confirmation of the same fact)."""
    Item.objects.filter(pk=item.pk).update(value=value, importance=importance, updated_at=now)


def delete(owner: Any, namespace: Sequence[str], key: str) -> int:
    """Delete every version of the key; returns how many rows went."""
    gone, _ = (
        Item.objects.for_owner(sessions.owner_id(owner))
        .filter(namespace=joined(namespace), key=key)
        .delete()
    )
    return gone


def sweep_expired(now: dt.datetime | None = None, *, batch_size: int = 1000) -> int:
    """Delete expired items, ``batch_size`` per statement; returns how many."""
    now = now or timezone.now()
    total = 0
    while True:
        ids = list(
            Item.objects.filter(expires_at__lte=now).values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            return total
        total += Item.objects.filter(pk__in=ids).delete()[0]


def _pattern(path: Sequence[str], match_type: str) -> re.Pattern:
    labels = [r"[^.]+" if label == WILDCARD else re.escape(label) for label in path]
    body = r"\.".join(labels)
    if match_type == "prefix":
        return re.compile(rf"^{body}(\.|\Z)")
    return re.compile(rf"(^|\.){body}\Z")


def namespaces(
    owner: Any,
    conditions: Sequence[tuple[str, Sequence[str]]],
    *,
    max_depth: int | None,
    limit: int,
    offset: int,
) -> list[tuple[str, ...]]:
    """The owner's namespaces (of live items) matching every ``(match_type, path)`` condition
    (``*`` matches any one label), cut to ``max_depth`` labels, sorted, paginated."""
    qs = owned(owner)
    for match_type, path in conditions:
        if match_type == "prefix" and path and WILDCARD not in path:
            qs = under(qs, path)
    patterns = [_pattern(path, match_type) for match_type, path in conditions]
    found = set()
    for text in qs.order_by().values_list("namespace", flat=True).distinct().iterator():
        if all(p.search(text) for p in patterns):
            labels = split(text)
            found.add(labels[:max_depth] if max_depth is not None else labels)
    return sorted(found)[offset : offset + limit]


def order_by_recency(qs: QuerySet) -> QuerySet:
    return qs.order_by(F("updated_at").desc(), "namespace", "key")
