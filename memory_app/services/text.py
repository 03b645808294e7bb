"""The words of a query: what full-text search (messages, items) matches on."""

from __future__ import annotations

import re

_TERM = re.compile(r"[^\W_]+", re.UNICODE)
_FALLBACK_STOPWORDS = frozenset(
    "a an and are as at be but by did do does for from had has have how i in is it its me my of "
    "on or our she so that the their them then there they this to was we were what when where "
    "which who why will with you your".split()
)


def query_terms(text: str) -> set[str]:
    """The words of a text that carry meaning (lower-cased, common words left out)."""
    return {t for t in _TERM.findall(text.lower()) if t not in _FALLBACK_STOPWORDS}
