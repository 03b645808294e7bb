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
        (r"(?<!\bi )\balways\b|(?<!\bi )\bnever\b", 0.3),
        (r"\bprefer(?:s|red|ence|ences)?\b", 0.5),
        (r"\bi (?:like|love|hate|dislike|can'?t stand)\b", 0.3),
        (r"\bfrom now on\b|\bgoing forward\b|\bin (?:the )?future\b", 0.5),
        (r"\bimportant\b|\bkeep in mind\b|\bnote that\b", 0.4),
    )

    def __init__(
        self, patterns: list[tuple[str, float]] | None = None, roles: tuple[str, ...] = ("user",)
    ) -> None:
        self.roles = tuple(roles)
        pairs = list(patterns or self.PATTERNS)
        # Lowercase patterns (the built-in ones) are matched against the lowercased text without
        # IGNORECASE, which lets re jump to a literal instead of trying every position.
        self._fold = all(p == p.lower() and "(?-" not in p for p, _ in pairs)
        flags = 0 if self._fold else re.IGNORECASE
        compiled = [(re.compile(p, flags), float(w)) for p, w in pairs]
        self._patterns = [(pattern, weight, _leads(pattern)) for pattern, weight in compiled]

    def explain(self, message: StoredMessage) -> list[tuple[str, float]]:
        """The patterns that matched and their weights."""
        if message.role not in self.roles or not message.content:
            return []
        text = message.content.lower() if self._fold else message.content
        return [
            (pattern.pattern, weight)
            for pattern, weight, leads in self._patterns
            if any(_matches_from(pattern, lead, text) for lead in leads)
        ]

    def score(self, message: StoredMessage) -> float:
        return min(1.0, sum(w for _, w in self.explain(message)))


# A \b or a lookbehind (without groups inside) at the start of an alternative.
_LEADING_ASSERTION = re.compile(r"\\b|\(\?<[!=](?:[^()\\]|\\.)*\)")


def _alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a regular expression (split at ``|`` outside groups and
    character classes)."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # A "]" right after "[" or "[^" is a literal, not the end of the class.
            i += 2 if pattern.startswith("^]", i + 1) else int(pattern.startswith("]", i + 1))
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _leads(compiled: re.Pattern) -> list[re.Pattern]:
    """Expressions that match wherever ``compiled`` can start a match: its alternatives, each
    without the leading ``\\b`` or lookbehind that keeps re from jumping to the literal after
    it (on a 750-word message, about 50 µs for the built-in list instead of 800). They may
    match more places, never fewer; ``_matches_from`` checks each with the pattern itself. A
    pattern with capturing groups (whose numbers would shift) is its own lead."""
    if compiled.groups:
        return [compiled]
    leads = []
    for alternative in _alternatives(compiled.pattern):
        while match := _LEADING_ASSERTION.match(alternative):
            alternative = alternative[match.end() :]
        try:
            leads.append(re.compile(alternative, compiled.flags))
        except re.error:  # e.g. inline global flags, valid only at the very start
            return [compiled]
    return leads


def _matches_from(pattern: re.Pattern, lead: re.Pattern, text: str) -> bool:
    """Whether ``pattern`` matches ``text`` at a place where ``lead`` does."""
    position = 0
    while (hit := lead.search(text, position)) is not None:
        if pattern.match(text, hit.start()):  # \b and lookbehinds see the text before it
            return True
        position = hit.start() + 1
    return False


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
