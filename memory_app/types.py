"""Value types: what the adapter takes and returns. Plain, immutable, detached from the ORM."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

#: The roles of OpenAI chat messages (``models.Role`` holds the same four).
ROLES = ("system", "user", "assistant", "tool")
#: How ``search()`` ranks: vectors and full text fused, or one of them alone.
SEARCH_MODES = ("hybrid", "vector", "fulltext")
#: How hybrid search fuses its rankings (``MEMORY_APP["FUSION"]``), and how combsum normalises
#: each ranking's scores (``MEMORY_APP["FUSION_NORMALISATION"]``).
FUSION_METHODS = ("combsum", "rrf")
FUSION_NORMALISATIONS = ("minmax", "z")


class _AnyOwner:
    def __repr__(self) -> str:
        return "ANY_OWNER"


#: Pass as ``owner`` to look across all owners (staff tools, admin). Never the default.
ANY_OWNER: Any = _AnyOwner()


def openai_dict(
    role, content, content_parts, name, tool_calls, tool_call_id, extra
) -> dict[str, Any]:
    """The OpenAI chat-message form of stored fields (only the keys that are set)."""
    message: dict[str, Any] = {"role": role}
    if content_parts is not None:
        message["content"] = content_parts
    elif content or not tool_calls:
        message["content"] = content
    else:
        message["content"] = None
    if name:
        message["name"] = name
    if tool_calls:
        message["tool_calls"] = tool_calls
    if tool_call_id:
        message["tool_call_id"] = tool_call_id
    if extra:
        for key, value in extra.items():
            message.setdefault(key, value)
    return message


@dataclass(frozen=True)
class NewMessage:
    """A validated message, ready to store (what the rule book hands the log)."""

    role: str
    content: str
    content_parts: list | None
    name: str = ""
    tool_calls: list | None = None
    tool_call_id: str = ""
    extra: dict | None = None
    metadata: dict = field(default_factory=dict)
    remember: bool = False
    idempotency_key: str | None = None

    def as_openai(self) -> dict[str, Any]:
        return openai_dict(
            self.role,
            self.content,
            self.content_parts,
            self.name,
            self.tool_calls,
            self.tool_call_id,
            self.extra,
        )


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
        return openai_dict(
            self.role,
            self.content,
            self.content_parts,
            self.name,
            self.tool_calls,
            self.tool_call_id,
            self.extra,
        )

    def as_dict(self) -> dict[str, Any]:
        """OpenAI form plus the store's own fields (cursor, metadata, ...)."""
        data = self.as_openai()
        data.update(
            cursor=self.cursor,
            metadata=self.metadata,
            tokens=self.tokens,
            remember=self.remember,
            created_at=self.created_at,
        )
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
    messages do not). ``summary_truncated``: the snapshot's summary was cut to fit the budget.
    ``unanswered_tool_calls``: ids of tool calls left out because their result is not in the
    window (OpenAI refuses a call without its result). ``blocks``: the memory blocks carried
    (in one system message).
    """

    messages: list[dict[str, Any]]
    cursors: list[int | None]
    tokens: int
    budget_tokens: int
    snapshot_version: int | None = None
    first_cursor: int | None = None
    summary_truncated: bool = False
    unanswered_tool_calls: tuple[str, ...] = ()
    blocks: tuple[MemoryBlock, ...] = ()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index):
        return self.messages[index]


@dataclass(frozen=True)
class SearchResult:
    """One message found by ``search()``.

    ``score`` is higher for better matches: cosine similarity for ``vector``, ``ts_rank``
    (or shared words, off PostgreSQL) for ``fulltext``, the fused score for ``hybrid`` (see
    ``MEMORY_APP["FUSION"]``; comparable within one search only). ``ranks`` gives the message's
    1-based rank in each ranking that found it.
    """

    message: StoredMessage
    score: float
    session_id: uuid.UUID
    ranks: dict[str, int] = field(default_factory=dict)

    @property
    def cursor(self) -> int:
        return self.message.cursor


@dataclass(frozen=True)
class RecallWindow(Window):
    """A ``Window`` with recalled messages added in one system message (its cursor is ``None``).

    ``recalled`` are the search results that made it into the block; ``recall_tokens`` is what
    the block costs (included in ``tokens`` and ``budget_tokens``). When the embedder fails,
    the window is the plain one and ``recall_error`` says why.
    """

    recalled: tuple[SearchResult, ...] = ()
    recall_tokens: int = 0
    #: The owner's facts in the block (``context(memories=k)``), before the recalled messages.
    memories: tuple[MemoryView, ...] = ()
    #: Why nothing was recalled when the search failed (the embedder was down), else None.
    recall_error: str | None = None


@dataclass(frozen=True)
class ErasedRows:
    """How many rows of each table an erase (or a session delete) removed."""

    sessions: int = 0
    messages: int = 0
    snapshots: int = 0
    embeddings: int = 0
    checkpoints: int = 0
    checkpoint_blobs: int = 0
    checkpoint_writes: int = 0
    items: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint as stored: the framework's own data, decrypted, not yet deserialised.

    ``values`` maps each channel to its ``(type, bytes)`` as the serialiser wrote them;
    ``writes`` are the pending writes ``(task_id, channel, type, bytes)`` in replay order."""

    session_id: uuid.UUID
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str
    checkpoint: dict
    metadata: dict
    values: dict[str, tuple[str, bytes]]
    writes: list[tuple[str, str, str, bytes]]
    created_at: dt.datetime | None = None


@dataclass(frozen=True)
class Scheduled:
    """What asking for background work did: ``state`` is ``"queued"`` (a worker will do it),
    ``"ran"`` (no broker: done inline, ``result`` holds the task's answer), ``"pending"`` (one
    is already queued or running for the session), or ``"failed"`` (``error`` says why; a
    sweep catches up later)."""

    state: str
    task_id: str | None = None
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.state in ("queued", "ran", "pending")


@dataclass(frozen=True)
class MemoryView:
    """One version of a learned memory: a fact about an owner, where it came from, and when it
    was in force (``invalid_at`` is ``None`` while it is). Versions of one memory share its
    ``key``; ``ended`` says why a past version ended (``"superseded"`` by a newer one,
    ``"retired"``, ``"evicted"`` by the per-owner cap)."""

    key: str
    text: str
    importance: float | None
    valid_from: dt.datetime
    invalid_at: dt.datetime | None = None
    session_id: uuid.UUID | None = None
    source_cursors: tuple[int, ...] = ()
    metadata: dict = field(default_factory=dict)
    topic: str = ""
    ended: str = ""
    confirmations: int = 0
    id: uuid.UUID | None = None
    score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryOp:
    """What an extractor learned from a batch of messages: ``"add"`` a fact, or ``"update"``
    the memory ``key`` (its current version is superseded by ``text``). ``cursors``: the
    messages it came from."""

    action: str
    text: str
    importance: float = 0.5
    cursors: tuple[int, ...] = ()
    key: str | None = None
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryBlock:
    """A named, size-limited text an agent keeps and edits (a persona, the user's profile, a
    task list), for its owner (``scope="owner"``) or one session (``"session"``); every window
    of the session carries it."""

    name: str
    text: str
    scope: str
    limit: int
    updated_at: dt.datetime | None = None
