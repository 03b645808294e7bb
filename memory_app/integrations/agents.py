"""The OpenAI Agents SDK's ``Session`` protocol over a memory session.

    from agents import Agent, Runner
    from memory_app.integrations.agents import MemorySession

    session = await MemorySession.aopen("chat-42", owner=user, namespace="support-bot")
    result = await Runner.run(agent, "Hi", session=session)

Every SDK item becomes one message of the log, so the admin and the API show a readable chat
transcript, while the item itself is kept verbatim in the message's metadata and handed back
unchanged by ``get_items``:

- user / system / developer / assistant messages -> that role (developer -> system), with the
  text of their content parts as the content;
- ``function_call`` (and other ``*_call`` items with a ``call_id``) -> an assistant message with
  one ``tool_calls`` entry; ``*_call_output`` -> a ``tool`` message answering it;
- ``reasoning`` and anything else -> an assistant message with empty content.

Messages stored by other means (the API, ``Conversation``) are turned into SDK items on read.

``pop_item`` deletes the newest message (``SessionMemory.pop_last``); its cursor is never handed
out again, so the log has a gap where it was.

A cancelled ``add_items``, ``pop_item`` or ``clear_session`` stays pending until its write has
finished, then raises ``CancelledError``, as the SDK's own stores do: once the task is done the
write is either fully there or absent. Unknown ``session_settings`` keys raise ``TypeError``.

``CompactingMemorySession`` is the same store for long conversations: ``get_items`` hands the
model the latest snapshot's summary and the newest items after it, within a budget, and the
part that no longer fits is folded into the summary by the store's compaction (the
``summarize_session`` task): the SDK's ``OpenAIResponsesCompactionSession`` design, for any model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from ..aio import run_write
from ..exceptions import InvalidCursor, InvalidMessage, MemoryStoreError
from ..memory import Memory, SessionMemory
from ..tools import TOOL_SPECS, MemoryTools
from ..types import StoredMessage

try:
    import agents.memory as _sdk_memory
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "memory_app.integrations.agents needs the OpenAI Agents SDK: "
        "pip install 'django-memory-app[agents]'"
    ) from err


@dataclasses.dataclass(frozen=True)
class _Settings:
    """Stands in for ``SessionSettings`` on SDK versions older than it (they never read it)."""

    limit: int | None = None


# Session settings (a default ``limit``) came with later SDK versions; older ones work without.
SessionSettings: Any = getattr(_sdk_memory, "SessionSettings", None) or _Settings

logger = logging.getLogger(__name__)

__all__ = [
    "ITEM_KEY",
    "CompactingMemorySession",
    "MemorySession",
    "memory_tools",
    "item_to_message",
    "message_to_items",
]


def _settings_fields() -> set[str]:
    if dataclasses.is_dataclass(SessionSettings):  # pydantic dataclasses are dataclasses too
        return {f.name for f in dataclasses.fields(SessionSettings) if f.init}
    return set(getattr(SessionSettings, "model_fields", None) or {"limit"})


def session_settings_from(value: Any) -> Any:
    """A ``SessionSettings`` for ``value`` (one, a dict of its fields, or ``None``).

    Unknown keys raise ``TypeError("Unknown session settings: ...")`` as the SDK's own stores
    do, on every SDK version: some versions would otherwise drop them silently.
    """
    if value is None:
        return SessionSettings()
    if isinstance(value, Mapping):
        unknown = sorted(str(name) for name in value if name not in _settings_fields())
        if unknown:
            raise TypeError(f"Unknown session settings: {', '.join(unknown)}")
        return SessionSettings(**value)
    if isinstance(value, SessionSettings):
        return value
    raise TypeError(
        f"session_settings must be a {SessionSettings.__name__} instance or a dict, "
        f"got {type(value).__name__}"
    )


#: Key of the message metadata that holds the SDK item.
ITEM_KEY = "agents_item"
# Item fields whose (string) value is stored once, in the message itself, and restored from it.
_FROM_CONTENT = ("content", "output")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_CALL_FIELDS_NOT_ARGUMENTS = {"type", "id", "call_id", "status", "provider_data", "name"}


def _text_of(value: Any) -> str:
    """The readable text of an item's content or output: a string, or the text of its parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            field = _TEXT_PARTS.get(part.get("type")) if isinstance(part, dict) else None
            if field and isinstance(part.get(field), str):
                texts.append(part[field])
        return "\n".join(texts)
    return json.dumps(value, ensure_ascii=False)


def _call_arguments(item: dict) -> str:
    for field in ("arguments", "input"):
        if isinstance(item.get(field), str):
            return item[field]
    return json.dumps(
        {k: v for k, v in item.items() if k not in _CALL_FIELDS_NOT_ARGUMENTS}, ensure_ascii=False
    )


def item_to_message(item: dict[str, Any]) -> dict[str, Any]:
    """The chat message standing for one SDK item, with the item kept in its metadata."""
    if not isinstance(item, dict):
        raise InvalidMessage(
            "item", f"an Agents SDK item must be a dict, not {type(item).__name__}"
        )
    kind = item.get("type")
    role = item.get("role")
    message: dict[str, Any]
    if role in ("user", "system", "developer", "assistant") and kind in (None, "message"):
        message = {
            "role": "system" if role == "developer" else role,
            "content": _text_of(item.get("content")),
        }
    elif isinstance(kind, str) and kind.endswith("_call") and isinstance(item.get("call_id"), str):
        name = (
            item.get("name")
            if isinstance(item.get("name"), str) and item["name"]
            else kind[: -len("_call")]
        )
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": name, "arguments": _call_arguments(item)},
                }
            ],
        }
    elif (
        isinstance(kind, str)
        and kind.endswith("_call_output")
        and isinstance(item.get("call_id"), str)
    ):
        message = {
            "role": "tool",
            "tool_call_id": item["call_id"],
            "content": _text_of(item.get("output")),
        }
    else:  # reasoning, hosted tool calls, references, compaction items...
        message = {"role": "assistant", "content": ""}

    kept = dict(item)
    restored = []
    for field in _FROM_CONTENT:
        if isinstance(kept.get(field), str) and kept[field] == message.get("content"):
            del kept[field]  # stored once, as the message content
            restored.append(field)
    if (
        message.get("tool_calls")
        and kept.get("arguments") == message["tool_calls"][0]["function"]["arguments"]
    ):
        del kept["arguments"]
        restored.append("arguments")
    message["metadata"] = {ITEM_KEY: {"item": kept, "restore": restored}}
    return message


def message_to_items(message: StoredMessage) -> list[dict[str, Any]]:
    """The SDK items a stored message stands for: the kept item, or a conversion of the message."""
    saved = (message.metadata or {}).get(ITEM_KEY)
    if isinstance(saved, dict) and isinstance(saved.get("item"), dict):
        item = dict(saved["item"])
        for field in saved.get("restore", ()):
            if field == "arguments":
                item[field] = message.tool_calls[0]["function"]["arguments"]
            else:
                item[field] = message.content
        return [item]
    # A message not written by the SDK: map the chat message to the closest items.
    return chat_message_to_items(
        {
            "role": message.role,
            "content": message.content,
            "tool_calls": message.tool_calls,
            "tool_call_id": message.tool_call_id,
        }
    )


def chat_message_to_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The SDK items closest to an OpenAI chat message (a window's summary, a stored message)."""
    if message["role"] == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message["tool_call_id"],
                "output": _text_of(message.get("content")),
            }
        ]
    items: list[dict[str, Any]] = []
    if message.get("content") or not message.get("tool_calls"):
        items.append({"role": message["role"], "content": _text_of(message.get("content"))})
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
            }
        )
    return items


class MemorySession:
    """An implementation of the Agents SDK ``Session`` protocol backed by ``SessionMemory``.

    ``session_id`` is the memory session's id. ``session_settings`` (a ``SessionSettings`` or a
    dict of its fields) gives the default ``limit`` of ``get_items``.
    """

    def __init__(self, memory: SessionMemory, session_settings: Any = None) -> None:
        self.memory = memory
        self.session_id: str = str(memory.id)
        self.session_settings = session_settings_from(session_settings)

    @classmethod
    def open(
        cls,
        key: str,
        *,
        owner=None,
        namespace: str | None = None,
        session_settings: Any = None,
        **options: Any,
    ) -> MemorySession:
        """The session ``key`` of ``owner`` in ``namespace`` (created when missing), as an SDK
        session.

        ``options`` other than ``Memory.session``'s go to the class (``CompactingMemorySession``).
        """
        settings = session_settings_from(session_settings)  # bad settings create no session
        opened, own = cls._split_options(options)
        return cls(Memory.session(key, owner=owner, namespace=namespace, **opened), settings, **own)

    @classmethod
    async def aopen(
        cls,
        key: str,
        *,
        owner=None,
        namespace: str | None = None,
        session_settings: Any = None,
        **options: Any,
    ) -> MemorySession:
        settings = session_settings_from(session_settings)
        opened, own = cls._split_options(options)
        memory = await run_write(Memory.session, key, owner=owner, namespace=namespace, **opened)
        return cls(memory, settings, **own)

    @classmethod
    def _split_options(cls, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return options, {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.memory!r}>"

    def _limit(self, limit: int | None) -> int | None:
        return self.session_settings.limit if limit is None else limit

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history, oldest first; with ``limit``, only the newest ``limit`` items.

        As in the SDK's own SQLite session, ``limit=0`` gives nothing and a negative limit all.
        """
        return await self._stored_items(self._limit(limit))

    async def _stored_items(self, limit: int | None) -> list[dict[str, Any]]:
        if limit is not None and limit == 0:
            return []
        if limit is None or limit < 0:
            stored = await self.memory.amessages()
        else:
            stored = await self.memory.alast(limit)
        items = [item for message in stored for item in message_to_items(message)]
        return items if limit is None or limit < 0 else items[-limit:]

    async def add_items(self, items: list[dict[str, Any]]) -> None:
        """Append the items, all or none, one message each (natively async on PostgreSQL)."""
        if not items:
            return
        await self.memory.aadd_many([item_to_message(item) for item in items])

    async def pop_item(self) -> dict[str, Any] | None:
        """Remove the newest item and return it (``None`` when empty); its cursor is not reused.

        A message not written by the SDK that stands for several items (an assistant reply with
        tool calls) is removed whole; its last item is returned.
        """
        popped = await run_write(self.memory.pop_last)
        return message_to_items(popped)[-1] if popped is not None else None

    async def clear_session(self) -> None:
        """Remove every item (and the session's snapshots and metadata); cursors are not reused."""
        await run_write(self.memory.clear)


class CompactingMemorySession(MemorySession):
    """A ``MemorySession`` whose history handed to the model is bounded by the store's snapshots.

        session = await CompactingMemorySession.aopen("chat-42", owner=user, max_tokens=4000)
        await Runner.run(agent, "Hi", session=session)

    ``get_items()`` (what the ``Runner`` sends the model) is the session's context window: the
    latest snapshot's summary first, as a user message item, then the newest items after the
    snapshot within ``max_tokens`` / ``max_messages`` (whole tool calls with their results;
    system and developer items are always kept). Every item stays in the log, so the admin,
    the API and exports see the whole conversation until compaction prunes it.

    After each ``add_items``, when items after the snapshot no longer fit the budget, the
    session is compacted by the store (``SessionMemory.summarize_async``: the
    ``summarize_session`` task, run inline when no broker is configured): everything but the
    newest ``keep_recent`` messages (default ``SUMMARIZE_KEEP_RECENT``) is folded into the
    summary, by compare-and-swap. ``run_compaction()`` (the SDK's compaction hook, called by
    the ``Runner`` after Responses API turns) does the same check; ``{"force": True}``
    compacts now whatever the budget.

    ``get_items(limit)`` with an explicit ``limit`` reads the log's newest ``limit`` items, as
    the protocol asks: the SDK reads the tail that way to check its own writes. A
    ``session_settings`` limit is such a limit too, so leave it unset here.
    """

    _OWN_OPTIONS = ("max_tokens", "max_messages", "model", "keep_recent")

    def __init__(
        self,
        memory: SessionMemory,
        session_settings: Any = None,
        *,
        max_tokens: int | None = None,
        max_messages: int | None = None,
        model: str | None = None,
        keep_recent: int | None = None,
    ) -> None:
        super().__init__(memory, session_settings)
        for name, value in (
            ("max_tokens", max_tokens),
            ("max_messages", max_messages),
            ("keep_recent", keep_recent),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative integer or None, not {value!r}")
        self.max_tokens = max_tokens
        self.max_messages = max_messages
        self.model = model
        self.keep_recent = keep_recent

    @classmethod
    def _split_options(cls, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        own = {k: options[k] for k in cls._OWN_OPTIONS if k in options}
        return {k: v for k, v in options.items() if k not in own}, own

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The window (summary first, then the newest items that fit); with ``limit``, the log's
        tail."""
        limit = self._limit(limit)
        if limit is not None:
            return await self._stored_items(limit)
        return await run_write(self._window_items)  # a read, but one consistent thread hop

    def _window_items(self) -> list[dict[str, Any]]:
        window = self.memory.window(self.max_messages, self.max_tokens, model=self.model)
        logged = {c for c in window.cursors if c is not None}
        stored: dict[int, StoredMessage] = {}
        if window.first_cursor is not None:
            stored.update(
                (m.cursor, m)
                for m in self.memory.messages(after=window.first_cursor - 1)
                if m.cursor in logged
            )
        for cursor in logged - stored.keys():  # system messages before the tail (few)
            try:
                stored[cursor] = self.memory.get_message(cursor)
            except InvalidCursor:
                pass  # popped or cleared since the window was read
        items: list[dict[str, Any]] = []
        for message, cursor in zip(window.messages, window.cursors, strict=True):
            if cursor is None:  # the summary and the snapshot's pinned messages
                items.extend(chat_message_to_items(message))
            elif cursor in stored:
                items.extend(message_to_items(stored[cursor]))
        return items

    async def add_items(self, items: list[dict[str, Any]]) -> None:
        await super().add_items(items)
        if items:
            await run_write(self._request_compaction)

    def _request_compaction(self) -> None:
        try:
            self._compact_if_needed(force=False)
        except Exception:  # the items are stored: a failed compaction request must not undo that
            logger.exception("could not request compaction of session %s", self.session_id)

    def _compact_if_needed(self, *, force: bool) -> str | None:
        """Request compaction when items after the snapshot fall out of the window; the task id."""
        if not force and not self._overflows():
            return None
        return self.memory.summarize_async(self.keep_recent)

    def _overflows(self) -> bool:
        """Whether a message after the latest snapshot is left out of the window."""
        if self.max_tokens is None and self.max_messages is None:
            return False  # no budget: the store's own threshold (SUMMARIZE_THRESHOLD_TOKENS) rules
        snapshot = self.memory.latest_snapshot()
        after = snapshot.upto if snapshot else None
        while (
            True
        ):  # the oldest non-system message after the snapshot (system ones are always kept)
            page = self.memory.messages(after=after, limit=16)
            if not page:
                return False
            oldest = next((m for m in page if m.role != "system"), None)
            if oldest is not None:
                break
            after = page[-1].cursor
        window = self.memory.window(self.max_messages, self.max_tokens, model=self.model)
        return window.first_cursor is None or oldest.cursor < window.first_cursor

    async def run_compaction(self, args: Mapping[str, Any] | None = None) -> None:
        """The SDK's compaction hook: compact if the window overflows, or now with ``force``."""
        force = bool((args or {}).get("force"))
        await run_write(self._compact_if_needed, force=force)


# ---- the memory tools as function tools ----------------------------------------------------------
def memory_tools(owner: Any = None, *, namespace: str | None = None, session_id=None) -> list:
    """The memory tools (``memory_app.tools``: ``search_memory``, ``remember``,
    ``edit_memory_block``) as Agents SDK function tools
    acting for ``owner``: ``Agent(tools=memory_tools(user))``. Bad arguments come back to the
    model as the rule book's error message, not as an exception that ends the run."""
    from agents import FunctionTool

    tools = MemoryTools(owner, namespace=namespace, session_id=session_id)
    calls = {spec.name: getattr(tools, "a" + spec.name) for spec in TOOL_SPECS}

    def invoke(name: str):
        async def run(_context: Any, arguments: str) -> str:
            try:
                parsed = json.loads(arguments or "{}")
                if not isinstance(parsed, dict):
                    raise InvalidMessage("arguments", "must be a JSON object")
                return await calls[name](**parsed)
            except (MemoryStoreError, TypeError, ValueError) as err:
                return f"error: {err}"

        return run

    return [
        FunctionTool(
            name=spec.name,
            description=spec.description,
            params_json_schema=spec.parameters,
            on_invoke_tool=invoke(spec.name),
            strict_json_schema=False,
        )
        for spec in TOOL_SPECS
    ]
