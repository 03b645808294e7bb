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
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async

from ..exceptions import InvalidMessage
from ..memory import Memory, SessionMemory
from ..types import StoredMessage

try:
    import agents.memory as _sdk_memory
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "memory_app.integrations.agents needs the OpenAI Agents SDK: "
        "pip install 'django-memory-app[agents]'"
    ) from err

# Session settings (a default ``limit``) came with later SDK versions; older ones work without.
SessionSettings: Any = getattr(_sdk_memory, "SessionSettings", None)

__all__ = ["ITEM_KEY", "MemorySession", "item_to_message", "message_to_items"]

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
    return json.dumps({k: v for k, v in item.items() if k not in _CALL_FIELDS_NOT_ARGUMENTS},
                      ensure_ascii=False)


def item_to_message(item: dict[str, Any]) -> dict[str, Any]:
    """The chat message standing for one SDK item, with the item kept in its metadata."""
    if not isinstance(item, dict):
        raise InvalidMessage("item", f"an Agents SDK item must be a dict, not {type(item).__name__}")
    kind = item.get("type")
    role = item.get("role")
    message: dict[str, Any]
    if role in ("user", "system", "developer", "assistant") and kind in (None, "message"):
        message = {"role": "system" if role == "developer" else role, "content": _text_of(item.get("content"))}
    elif isinstance(kind, str) and kind.endswith("_call") and isinstance(item.get("call_id"), str):
        name = item.get("name") if isinstance(item.get("name"), str) and item["name"] else kind[: -len("_call")]
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": item["call_id"], "type": "function",
            "function": {"name": name, "arguments": _call_arguments(item)},
        }]}
    elif isinstance(kind, str) and kind.endswith("_call_output") and isinstance(item.get("call_id"), str):
        message = {"role": "tool", "tool_call_id": item["call_id"], "content": _text_of(item.get("output"))}
    else:  # reasoning, hosted tool calls, references, compaction items...
        message = {"role": "assistant", "content": ""}

    kept = dict(item)
    restored = []
    for field in _FROM_CONTENT:
        if isinstance(kept.get(field), str) and kept[field] == message.get("content"):
            del kept[field]  # stored once, as the message content
            restored.append(field)
    if message.get("tool_calls") and kept.get("arguments") == message["tool_calls"][0]["function"]["arguments"]:
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
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}]
    items: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        items.append({"role": message.role, "content": message.content})
    for call in message.tool_calls or ():
        function = call.get("function", {})
        items.append({"type": "function_call", "call_id": call["id"], "name": function.get("name", ""),
                      "arguments": function.get("arguments", "")})
    return items


class MemorySession:
    """An implementation of the Agents SDK ``Session`` protocol backed by ``SessionMemory``.

    ``session_id`` is the memory session's id. ``session_settings`` (a ``SessionSettings`` or a
    dict of its fields) gives the default ``limit`` of ``get_items``.
    """

    def __init__(self, memory: SessionMemory, session_settings: Any = None) -> None:
        self.memory = memory
        self.session_id: str = str(memory.id)
        if isinstance(session_settings, dict):
            session_settings = SessionSettings(**session_settings)
        elif session_settings is None and SessionSettings is not None:
            session_settings = SessionSettings()
        self.session_settings = session_settings

    @classmethod
    def open(cls, key: str, *, owner=None, namespace: str | None = None,
             session_settings: Any = None, **options: Any) -> MemorySession:
        """The session ``key`` of ``owner`` in ``namespace`` (created when missing), as an SDK session."""
        return cls(Memory.session(key, owner=owner, namespace=namespace, **options), session_settings)

    @classmethod
    async def aopen(cls, key: str, *, owner=None, namespace: str | None = None,
                    session_settings: Any = None, **options: Any) -> MemorySession:
        memory = await sync_to_async(Memory.session)(key, owner=owner, namespace=namespace, **options)
        return cls(memory, session_settings)

    def __repr__(self) -> str:
        return f"<MemorySession {self.memory!r}>"

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history, oldest first; with ``limit``, only the newest ``limit`` items.

        As in the SDK's own SQLite session, ``limit=0`` gives nothing and a negative limit all.
        """
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and limit == 0:
            return []
        if limit is None or limit < 0:
            stored = await self.memory.amessages()
        else:
            stored = await self.memory.alast(limit)
        items = [item for message in stored for item in message_to_items(message)]
        return items if limit is None or limit < 0 else items[-limit:]

    async def add_items(self, items: list[dict[str, Any]]) -> None:
        """Append the items, all or none, one message each."""
        if not items:
            return
        await self.memory.aadd_many([item_to_message(item) for item in items])

    async def pop_item(self) -> dict[str, Any] | None:
        """Remove the newest item and return it (``None`` when empty); its cursor is not reused.

        A message not written by the SDK that stands for several items (an assistant reply with
        tool calls) is removed whole; its last item is returned.
        """
        popped = await self.memory.apop_last()
        return message_to_items(popped)[-1] if popped is not None else None

    async def clear_session(self) -> None:
        """Remove every item (and the session's snapshots and metadata); cursors are not reused."""
        await self.memory.aclear()
