"""What the adapter returns: plain, immutable values, detached from the ORM."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .validation import openai_dict


@dataclass(frozen=True)
class StoredMessage:
    """A message of the log. ``cursor`` is its place: gapless, ordered, never reused."""

    cursor: int
    role: str
    content: str
    content_parts: list | None = None
    name: str = ""
    tool_calls: list | None = None
    tool_call_id: str = ""
    extra: dict | None = None
    metadata: dict = field(default_factory=dict)
    tokens: int = 0
    remember: bool = False
    idempotency_key: str | None = None
    created_at: dt.datetime | None = None
    id: int | None = None

    def as_openai(self) -> dict[str, Any]:
        """The message as OpenAI's chat API takes it."""
        return openai_dict(self.role, self.content, self.content_parts, self.name,
                           self.tool_calls, self.tool_call_id, self.extra)

    def as_dict(self) -> dict[str, Any]:
        """OpenAI form plus the store's own fields (cursor, metadata, ...)."""
        data = self.as_openai()
        data.update(cursor=self.cursor, metadata=self.metadata, tokens=self.tokens,
                    remember=self.remember, created_at=self.created_at)
        if self.idempotency_key:
            data["idempotency_key"] = self.idempotency_key
        return data


@dataclass(frozen=True)
class SnapshotView:
    """A saved summary standing for every message up to cursor ``upto``."""

    version: int
    upto: int
    summary: str
    pinned: list[dict] = field(default_factory=list)
    model: str = ""
    metadata: dict = field(default_factory=dict)
    created_at: dt.datetime | None = None


@dataclass(frozen=True)
class SessionInfo:
    id: uuid.UUID
    key: str
    namespace: str
    title: str
    owner_id: Any
    message_count: int
    token_count: int
    has_snapshot: bool
    created_at: dt.datetime
    updated_at: dt.datetime
    expires_at: dt.datetime | None
    metadata: dict


@dataclass(frozen=True)
class Window:
    """What to send the model next.

    ``messages`` are OpenAI chat messages, ready to send; ``cursors`` gives each one's cursor
    (``None`` for the summary and pinned messages, which are not in the log). ``tokens`` counts
    every message; ``budget_tokens`` only those that count toward ``max_tokens`` (system
    messages do not).
    """

    messages: list[dict[str, Any]]
    cursors: list[int | None]
    tokens: int
    budget_tokens: int
    snapshot_version: int | None = None
    first_cursor: int | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index):
        return self.messages[index]
