"""Which messages matter for recall: importance scoring and the should-recall hook.

Importance: a message flagged ``remember=True`` by the caller, or scored at least
``IMPORTANCE_THRESHOLD`` by the ``IMPORTANCE_SCORER``, is *remembered*: the flag is stored on
the message, it is embedded right after the append commits (even with ``EMBED_ON_APPEND``
off), and compaction never prunes it.

Scorers are classes with ``score(message) -> float`` (0 = unimportant, 1 = surely important).
The default, ``KeywordImportanceScorer``, is deliberately transparent: a short list of phrases
people use when they state lasting facts or preferences ("remember", "my name is", "always",
"I prefer", ...), each with a weight; ``explain()`` says which matched.

Should-recall: ``SHOULD_RECALL`` names a class with ``for_query(text) -> bool`` (is a search
worth it for this query?) and ``for_message(message) -> bool`` (is this message worth
embedding?). The default skips empty texts and bare acknowledgements ("ok", "thanks").
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

from .conf import memory_settings
from .types import NewMessage, StoredMessage


class ImportanceScorer(Protocol):
    # Scored before the insert: the message has role, content, name, metadata... but no cursor.
    def score(self, message: NewMessage) -> float: ...


class ShouldRecall(Protocol):
    def for_query(self, text: str) -> bool: ...

    def for_message(self, message: StoredMessage) -> bool: ...


class KeywordImportanceScorer:
    """Sum of the weights of the phrases found in a message (capped at 1).

    Only ``roles`` are scored (by default the user's messages: what an assistant says about
    itself is rarely a fact worth keeping). Pass ``patterns`` to replace the list.
    """

    PATTERNS: tuple[tuple[str, float], ...] = (
        (r"\bremember\b", 1.0),
        (r"\bdon'?t forget\b|\bnever forget\b", 1.0),
        (r"\bmy name is\b|\bcall me\b", 1.0),
        (r"\bi(?: a|')m allergic\b|\ballerg(?:y|ies|ic)\b", 1.0),
        (r"\bmy (?:birthday|email|address|phone|wife|husband|partner|son|daughter)\b", 0.6),
        (r"\bi (?:always|never)\b", 0.5),
        (r"(?<!\bi )\b(?:always|never)\b", 0.3),
        (r"\bprefer(?:s|red|ence|ences)?\b", 0.5),
        (r"\bi (?:like|love|hate|dislike|can'?t stand)\b", 0.3),
        (r"\bfrom now on\b|\bgoing forward\b|\bin (?:the )?future\b", 0.5),
        (r"\bimportant\b|\bkeep in mind\b|\bnote that\b", 0.4),
    )
    #: Substrings one of which each of the PATTERNS needs: a message with none of them (most)
    #: skips the regular expressions (about 40 µs a message). Custom patterns have no hints.
    HINTS: tuple[str, ...] = (
        "remember", "forget", "name", "call me", "allerg", "birthday", "email", "address",
        "phone", "wife", "husband", "partner", "son", "daughter", "always", "never", "prefer",
        "like", "love", "hate", "stand", "now on", "forward", "future", "important", "mind",
        "note that",
    )  # fmt: skip

    def __init__(
        self, patterns: list[tuple[str, float]] | None = None, roles: tuple[str, ...] = ("user",)
    ) -> None:
        self.roles = tuple(roles)
        self._patterns = [
            (re.compile(p, re.IGNORECASE), float(w)) for p, w in (patterns or self.PATTERNS)
        ]
        self._hints = None if patterns else self.HINTS

    def explain(self, message: StoredMessage) -> list[tuple[str, float]]:
        """The patterns that matched and their weights."""
        if message.role not in self.roles or not message.content:
            return []
        if self._hints is not None:
            text = message.content.lower()
            if not any(hint in text for hint in self._hints):
                return []
        return [(p.pattern, w) for p, w in self._patterns if p.search(message.content)]

    def score(self, message: StoredMessage) -> float:
        return min(1.0, sum(w for _, w in self.explain(message)))


_ACKNOWLEDGEMENTS = frozenset(
    "ok okay k sure yes yep yeah no nope thanks thank you thx ty cool great nice fine good got it "
    "hi hello hey bye lol hmm alright right".split()
)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class DefaultShouldRecall:
    """Skip what cannot help: empty texts and messages made only of acknowledgements.

    A message with no text (an assistant's bare tool call) is not embedded. A query made only of
    words like "ok", "thanks", "hi" does not trigger a search.
    """

    def _substantive(self, text: str | None) -> bool:
        words = _WORD.findall((text or "").lower())
        return any(w not in _ACKNOWLEDGEMENTS for w in words)

    def for_query(self, text: str) -> bool:
        return self._substantive(text)

    def for_message(self, message: StoredMessage) -> bool:
        if message.remember:
            return bool((message.content or "").strip())
        return self._substantive(message.content)


@memory_settings.derived
def importance_scorer() -> ImportanceScorer | None:
    """The configured scorer instance (``IMPORTANCE_SCORER``), or ``None`` for no scoring."""
    cls = memory_settings.IMPORTANCE_SCORER
    return cls() if cls is not None else None


@memory_settings.derived
def should_recall() -> ShouldRecall:
    """The configured should-recall hook instance (``SHOULD_RECALL``)."""
    return memory_settings.SHOULD_RECALL()


def mark_important(messages: list[NewMessage]) -> list[NewMessage]:
    """The messages, those scoring at least ``IMPORTANCE_THRESHOLD`` flagged ``remember``:
    scored before the insert, so the flag is written by the append itself."""
    threshold = memory_settings.IMPORTANCE_THRESHOLD
    scorer = importance_scorer() if threshold is not None else None
    if scorer is None:
        return messages
    return [
        m if m.remember or scorer.score(m) < threshold else dataclasses.replace(m, remember=True)
        for m in messages
    ]
