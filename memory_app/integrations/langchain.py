"""LangChain's ``BaseChatMessageHistory`` over a memory session.

    from langchain_core.runnables.history import RunnableWithMessageHistory
    from memory_app.integrations.langchain import DjangoChatMessageHistory

    chain = RunnableWithMessageHistory(
        model, lambda session_id: DjangoChatMessageHistory(session_id, owner=user, namespace="bot"))
    chain.invoke("Hi", config={"configurable": {"session_id": "chat-42"}})

Each LangChain message is stored as the OpenAI chat message it stands for (so the admin, the
API, windows and search see an ordinary transcript), and LangChain's own serialisation of it
(``message_to_dict``: type, id, name, ``additional_kwargs``, ``response_metadata``, tool calls
with parsed ``args``, invalid tool calls, usage, artifacts...) goes in the message's metadata, so
reading it back gives an equal message. Messages stored by other means are converted with
LangChain's ``convert_to_messages``.

With ``max_tokens`` / ``max_messages`` the history reads the session's context window (snapshot
summary, system messages, newest whole tool groups) instead of the whole log: what a model
should see, converted from the OpenAI form (metadata such as message ids is not restored there).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from asgiref.sync import sync_to_async

from ..aio import run_write, worker_thread_connection
from ..exceptions import InvalidMessage, MemoryStoreError
from ..memory import Memory, SessionMemory
from ..tools import TOOL_SPECS, MemoryTools
from ..types import StoredMessage
from ..validation import ALLOWED_KEYS, PART_TYPES

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        BaseMessage,
        convert_to_messages,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.messages.utils import convert_to_openai_messages
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "memory_app.integrations.langchain needs LangChain: "
        "pip install 'django-memory-app[langchain]'"
    ) from err

__all__ = ["MESSAGE_KEY", "DjangoChatMessageHistory", "from_stored", "memory_tools", "to_stored"]

#: Key of the message metadata that holds LangChain's serialisation of the message.
MESSAGE_KEY = "langchain"
_ROLES = {"user", "assistant", "system", "tool"}


def _text(message: BaseMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(
        block if isinstance(block, str) else block.get("text", "")
        for block in message.content
        if isinstance(block, str)
        or (isinstance(block, dict) and isinstance(block.get("text"), str))
    )


def _openai_form(message: BaseMessage) -> dict[str, Any]:
    """The closest chat message the store accepts (the readable side; the rest is in metadata)."""
    try:
        converted = convert_to_openai_messages(message)
    except (ValueError, TypeError, KeyError):
        # Content blocks LangChain cannot express for OpenAI: keep their text.
        converted = {
            "role": "assistant" if message.type == "ai" else "user",
            "content": _text(message),
        }
    role = converted.get("role")
    if role == "developer":
        role = "system"
    elif role not in _ROLES:  # legacy "function" messages, ChatMessage with a custom role
        role = "user"
    form: dict[str, Any] = {"role": role, "content": converted.get("content") or ""}
    if isinstance(form["content"], list):
        parts = [p for p in form["content"] if isinstance(p, dict) and p.get("type") in PART_TYPES]
        form["content"] = parts or _text(
            message
        )  # provider-specific blocks (thinking...) stay in metadata
    if (
        converted.get("name")
        and isinstance(converted["name"], str)
        and len(converted["name"]) <= 128
    ):
        form["name"] = converted["name"]
    if (
        role == "assistant"
        and converted.get("tool_calls")
        and all(c.get("id") for c in converted["tool_calls"])
    ):
        form["tool_calls"] = converted["tool_calls"]
        if not form["content"]:
            form["content"] = None
    if role == "tool":
        form["tool_call_id"] = converted.get("tool_call_id") or getattr(message, "tool_call_id", "")
    extra = {k: v for k, v in converted.items() if k not in ALLOWED_KEYS}
    if extra:  # OpenAI fields such as "refusal"
        form["extra"] = extra
    return form


def to_stored(message: BaseMessage) -> dict[str, Any]:
    """The message to append for a LangChain message: its OpenAI form plus LangChain's own data."""
    if not isinstance(message, BaseMessage):
        raise InvalidMessage(
            "message", f"must be a LangChain BaseMessage, not {type(message).__name__}"
        )
    form = _openai_form(message)
    serialised = message_to_dict(message)
    data = dict(serialised["data"])
    if isinstance(data.get("content"), str) and data["content"] == (form["content"] or ""):
        del data["content"]  # stored once, as the message content
    try:
        kept = json.loads(json.dumps({"type": serialised["type"], "data": data}))
    except (TypeError, ValueError) as err:
        raise InvalidMessage(
            "metadata", f"the LangChain message is not JSON-serialisable: {err}"
        ) from None
    form["metadata"] = {MESSAGE_KEY: kept}
    return form


def from_stored(stored: StoredMessage) -> BaseMessage:
    """The LangChain message for a stored one: exactly the one stored, or a conversion."""
    kept = (stored.metadata or {}).get(MESSAGE_KEY)
    if isinstance(kept, dict) and isinstance(kept.get("data"), dict) and kept.get("type"):
        data = dict(kept["data"])
        data.setdefault("content", stored.content)
        return messages_from_dict([{"type": kept["type"], "data": data}])[0]
    return convert_to_messages([stored.as_openai()])[0]


class DjangoChatMessageHistory(BaseChatMessageHistory):
    """A session's messages as a LangChain chat history (sync and async).

    ``session`` is a ``SessionMemory`` or the key of one; a key is opened (created if missing)
    for ``owner`` in ``namespace`` on first use, so the history may be built inside async code,
    as ``RunnableWithMessageHistory`` does.
    """

    def __init__(
        self,
        session: SessionMemory | str,
        *,
        owner=None,
        namespace: str | None = None,
        max_tokens: int | None = None,
        max_messages: int | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__()
        self._memory = session if isinstance(session, SessionMemory) else None
        self._key = None if isinstance(session, SessionMemory) else session
        self._owner = owner
        self._namespace = namespace
        self.max_tokens = max_tokens
        self.max_messages = max_messages
        self.model = model

    @property
    def memory(self) -> SessionMemory:
        """The session (opened on first use when built from a key)."""
        if self._memory is None:
            self._memory = Memory.session(self._key, owner=self._owner, namespace=self._namespace)
        return self._memory

    def __repr__(self) -> str:
        return f"<DjangoChatMessageHistory {self._key if self._memory is None else self._memory!r}>"

    # -- sync ---------------------------------------------------------------------------------
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The whole log, oldest first, or the context window when a budget is set."""
        with worker_thread_connection():
            return self._read()

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages atomically, in order: all stored or none."""
        with worker_thread_connection():
            self._add(messages)

    def clear(self) -> None:
        """Remove every message (cursors are never reused)."""
        with worker_thread_connection():
            self.memory.clear()

    # -- async (the ORM is synchronous: run in a thread, as Django's own async ORM does) --------
    async def aget_messages(self) -> list[BaseMessage]:
        return await sync_to_async(self._read)()

    # A cancelled write stays pending until its outcome is known, then raises CancelledError.
    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if messages:  # natively async on PostgreSQL (the store's async append)
            await self.memory.aadd_many([to_stored(m) for m in messages])

    async def aclear(self) -> None:
        await run_write(lambda: self.memory.clear())

    def _read(self) -> list[BaseMessage]:
        if self.max_tokens is None and self.max_messages is None:
            return [from_stored(m) for m in self.memory.messages()]
        window = self.memory.window(self.max_messages, self.max_tokens, model=self.model)
        return convert_to_messages(window.messages)

    def _add(self, messages: Sequence[BaseMessage]) -> None:
        if messages:
            self.memory.add_many([to_stored(m) for m in messages])


def memory_tools(owner: Any = None, *, namespace: str | None = None, session_id=None) -> list:
    """The memory tools (``memory_app.tools``: ``search_memory``, ``remember``,
    ``edit_memory_block``) as LangChain tools acting for
    ``owner`` (sync and async), for ``create_agent(tools=...)`` or ``model.bind_tools``. Bad
    arguments come back to the model as the rule book's error message."""
    from langchain_core.tools import StructuredTool, ToolException

    tools = MemoryTools(owner, namespace=namespace, session_id=session_id)

    def reported(call):
        def run(**arguments: Any) -> str:
            try:
                return call(**arguments)
            except MemoryStoreError as err:
                raise ToolException(str(err)) from err

        async def arun(**arguments: Any) -> str:
            try:
                return await getattr(tools, "a" + call.__name__)(**arguments)
            except MemoryStoreError as err:
                raise ToolException(str(err)) from err

        return run, arun

    calls = {spec.name: reported(getattr(tools, spec.name)) for spec in TOOL_SPECS}
    return [
        StructuredTool.from_function(
            func=calls[spec.name][0],
            coroutine=calls[spec.name][1],
            name=spec.name,
            description=spec.description,
            args_schema=spec.parameters,
            handle_tool_error=True,
        )
        for spec in TOOL_SPECS
    ]
