"""Recall filters (``validation.RecallFilters``) as ORM conditions, on messages and on items.

Metadata conditions apply to a JSON object (a message's ``metadata``, a memory's
``value["metadata"]``): ``{key: value}`` is equality, ``{key: {"$gt": 5}}`` a comparison. The
database compares JSON values: numbers as numbers, strings as text (so ISO 8601 dates written in
one form, ``2024-05-08`` or ``2024-05-08T10:00:00Z``, compare in time order); a value of another
type than the operand never matches a comparison.
"""

from __future__ import annotations

from django.db.models import Q

from ..validation import FILTER_OPERATORS, RecallFilters


def metadata_q(path: str, conditions: dict) -> Q:
    """``conditions`` on the JSON object at ``path`` (a field, or a field and its keys)."""
    q = Q()
    for key, wanted in conditions.items():
        field = f"{path}__{key}"
        tests = (
            wanted
            if isinstance(wanted, dict) and wanted and all(k in FILTER_OPERATORS for k in wanted)
            else {"$eq": wanted}
        )
        for operator, operand in tests.items():
            if operator == "$eq":
                q &= Q(**{field: operand})
            elif operator == "$ne":
                q &= ~Q(**{field: operand})
            elif operator == "$in":
                q &= Q(**{f"{field}__in": operand})
            else:
                q &= Q(**{f"{field}__{operator[1:]}": operand})
    return q


def message_q(filters: RecallFilters) -> Q:
    """The messages ``filters`` keeps (a condition on ``Message``)."""
    q = metadata_q("metadata", filters.metadata)
    if filters.created_after is not None:
        q &= Q(created_at__gte=filters.created_after)
    if filters.created_before is not None:
        q &= Q(created_at__lt=filters.created_before)
    if filters.namespace is not None:
        q &= Q(session__namespace=filters.namespace)
    if filters.session is not None:
        q &= Q(session_id=filters.session)
    return q


def item_q(filters: RecallFilters) -> Q:
    """The memories ``filters`` keeps (a condition on ``Item``: metadata under
    ``value["metadata"]``, created in the range, learned in the session or the namespace)."""
    q = metadata_q("value__metadata", filters.metadata)
    if filters.created_after is not None:
        q &= Q(created_at__gte=filters.created_after)
    if filters.created_before is not None:
        q &= Q(created_at__lt=filters.created_before)
    if filters.namespace is not None:
        q &= Q(session__namespace=filters.namespace)
    if filters.session is not None:
        q &= Q(session_id=filters.session)
    return q
