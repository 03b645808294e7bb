"""Turn an OpenAI chat message dict into the fields we store, or say exactly what is wrong.

Accepted keys: ``role``, ``content``, ``name``, ``tool_calls``, ``tool_call_id`` (OpenAI's), and
ours: ``metadata`` (dict), ``remember`` (bool), ``idempotency_key`` (str), ``extra`` (dict of other
OpenAI fields kept losslessly, e.g. ``refusal``). Anything else is refused, not silently dropped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .conf import memory_settings
from .encryption import ENCRYPTED_PREFIX
from .exceptions import InvalidMessage, MessageTooLarge
from .models import Role

ROLES = frozenset(r.value for r in Role)
ALLOWED_KEYS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "metadata", "remember",
     "idempotency_key", "extra"}
)
# Other fields OpenAI puts on chat messages. Accepted at the top level and kept in ``extra``,
# so a message read back (``as_openai()`` spreads ``extra``) can be stored or pinned again.
OPENAI_EXTRA_KEYS = frozenset({"refusal", "audio", "function_call", "annotations", "reasoning_content"})
#: Fields the store adds to a message it returns or exports: ``extra`` may not use them, or the
#: value sent would be silently replaced there (and lost by an export round trip).
STORE_KEYS = frozenset({"cursor", "tokens", "created_at"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
MAX_NAME = 128
MAX_KEY = 255


@dataclass(frozen=True)
class NewMessage:
    """A validated message, ready to store."""

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
        return openai_dict(self.role, self.content, self.content_parts, self.name,
                           self.tool_calls, self.tool_call_id, self.extra)


def openai_dict(role, content, content_parts, name, tool_calls, tool_call_id, extra) -> dict[str, Any]:
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


def validate_message(data: Any) -> NewMessage:
    if not isinstance(data, dict):
        raise InvalidMessage("message", f"must be an object, not {type(data).__name__}")
    promoted = {k: data[k] for k in OPENAI_EXTRA_KEYS & set(data)}
    if promoted:
        if data.get("extra") is not None and not isinstance(data.get("extra"), dict):
            raise InvalidMessage("extra", "must be an object")
        data = {k: v for k, v in data.items() if k not in promoted}
        data["extra"] = {**promoted, **(data.get("extra") or {})}
    unknown = sorted(set(data) - ALLOWED_KEYS)
    if unknown:
        raise InvalidMessage(str(unknown[0]), "unknown field (put other OpenAI fields in 'extra')")
    for key, value in data.items():
        problem = unstorable(value)
        if problem:
            raise InvalidMessage(key, problem)

    role = data.get("role")
    if not isinstance(role, str) or role not in ROLES:  # (an unhashable role would raise here)
        raise InvalidMessage("role", f"must be one of {', '.join(sorted(ROLES))}; got {role!r}")

    tool_calls = _tool_calls(data.get("tool_calls"), role)
    text, parts = _content(data.get("content", None), role, has_tool_calls=bool(tool_calls))

    tool_call_id = _optional(data, "tool_call_id", str, "")
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise InvalidMessage("tool_call_id", "a tool message needs the id of the call it answers")
    elif tool_call_id:
        raise InvalidMessage("tool_call_id", "only tool messages carry a tool_call_id")
    if len(tool_call_id) > MAX_KEY:
        raise InvalidMessage("tool_call_id", f"longer than {MAX_KEY} characters")

    name = _optional(data, "name", str, "")
    if len(name) > MAX_NAME:
        raise InvalidMessage("name", f"must be a string of at most {MAX_NAME} characters")

    metadata = _optional(data, "metadata", dict, {})
    extra = _optional(data, "extra", dict, None) or None
    if extra is not None:
        clash = set(extra) & (ALLOWED_KEYS | STORE_KEYS)
        if clash:
            raise InvalidMessage("extra", f"may not redefine {sorted(clash)[0]!r}")
    remember = data.get("remember", False)
    if not isinstance(remember, bool):
        raise InvalidMessage("remember", "must be true or false")
    key = data.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY):
        raise InvalidMessage("idempotency_key", f"must be a non-empty string of at most {MAX_KEY} characters")

    if text.startswith(ENCRYPTED_PREFIX):
        raise InvalidMessage("content", f"must not start with {ENCRYPTED_PREFIX!r} (marks encrypted text)")
    message = NewMessage(
        role=role, content=text, content_parts=parts, name=name, tool_calls=tool_calls,
        tool_call_id=tool_call_id, extra=extra or None, metadata=metadata, remember=remember,
        idempotency_key=key,
    )
    _check_size(message)
    return message


def _optional(data: dict, key: str, kind: type, default: Any) -> Any:
    """``data[key]`` if it is a ``kind``; ``default`` if absent or null; else ``InvalidMessage``."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise InvalidMessage(key, "must be " + ("a string" if kind is str else "an object"))
    return value


def unstorable(value: Any) -> str | None:
    """Why ``value`` (a string or JSON-like data, keys included) cannot be stored, or ``None``.

    PostgreSQL's text and jsonb refuse NUL characters and lone surrogates, and JSON has no NaN or
    infinity: refusing them here gives the caller a field-level error instead of a database error.
    Data nested deeper than ``MAX_JSON_DEPTH`` is refused too: no legitimate message needs it,
    and every reader of it (this check, JSON encoders, clients) would recurse that deep.
    """
    return _unstorable(value, memory_settings.MAX_JSON_DEPTH)


def _unstorable(value: Any, depth_left: int) -> str | None:
    if isinstance(value, str):
        if "\x00" in value:
            return "must not contain NUL characters"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must be valid Unicode (no lone surrogates)"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    if isinstance(value, (dict, list, tuple)) and depth_left <= 0:
        return f"must not be nested more than {memory_settings.MAX_JSON_DEPTH} levels deep (MAX_JSON_DEPTH)"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _unstorable(key, depth_left) if isinstance(key, str) else None
            if problem := problem or _unstorable(item, depth_left - 1):
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for item in value:
            if problem := _unstorable(item, depth_left - 1):
                return problem
    return None


def validate_messages(batch: Any) -> list[NewMessage]:
    if not isinstance(batch, (list, tuple)):
        raise InvalidMessage("messages", "must be a list of messages")
    if not batch:
        raise InvalidMessage("messages", "must not be empty")
    limit = memory_settings.MAX_BATCH_SIZE
    if len(batch) > limit:
        raise InvalidMessage("messages", f"at most {limit} messages per batch; got {len(batch)}")
    validated = []
    for index, item in enumerate(batch):
        try:
            validated.append(validate_message(item))
        except InvalidMessage as err:
            raise err.at(index) from None
    keys = [m.idempotency_key for m in validated if m.idempotency_key]
    if len(keys) != len(set(keys)):
        raise InvalidMessage("idempotency_key", "repeated within one batch")
    return validated


def _content(content: Any, role: str, *, has_tool_calls: bool) -> tuple[str, list | None]:
    if content is None:
        if role == "assistant" and has_tool_calls:
            return "", None
        raise InvalidMessage("content", f"a {role} message needs content")
    if isinstance(content, str):
        if content.count("\x00"):
            raise InvalidMessage("content", "must not contain NUL characters")
        return content, None
    if isinstance(content, list):
        if not content:
            raise InvalidMessage("content", "a list of content parts must not be empty")
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str) or part["type"] not in PART_TYPES:
                raise InvalidMessage(
                    "content", f"part {i} must be an object with type one of {', '.join(sorted(PART_TYPES))}"
                )
            if part["type"] in ("text", "refusal"):
                value = part.get(part["type"])
                if not isinstance(value, str):
                    raise InvalidMessage("content", f"part {i} needs a string {part['type']!r}")
                if "\x00" in value:
                    raise InvalidMessage("content", "must not contain NUL characters")
                texts.append(value)
        return "\n".join(texts), list(content)
    raise InvalidMessage("content", "must be a string, a list of content parts, or null")


def _tool_calls(tool_calls: Any, role: str) -> list | None:
    if tool_calls in (None, []):
        return None
    if role != "assistant":
        raise InvalidMessage("tool_calls", "only assistant messages carry tool calls")
    if not isinstance(tool_calls, list):
        raise InvalidMessage("tool_calls", "must be a list")
    seen = set()
    for i, call in enumerate(tool_calls):
        if not isinstance(call, dict):
            raise InvalidMessage("tool_calls", f"call {i} must be an object")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_KEY:
            raise InvalidMessage("tool_calls", f"call {i} needs a string id")
        if call_id in seen:
            raise InvalidMessage("tool_calls", f"call {i} repeats id {call_id!r}")
        seen.add(call_id)
        if call.get("type", "function") != "function":
            raise InvalidMessage("tool_calls", f"call {i}: type must be 'function'")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidMessage("tool_calls", f"call {i} needs function.name")
        if not isinstance(function.get("arguments", ""), str):
            raise InvalidMessage("tool_calls", f"call {i}: function.arguments must be a JSON string")
        if function.get("arguments", "").startswith(ENCRYPTED_PREFIX):
            raise InvalidMessage("tool_calls", f"call {i}: function.arguments must not start with "
                                               f"{ENCRYPTED_PREFIX!r} (marks encrypted text)")
    return tool_calls


def _check_size(message: NewMessage) -> None:
    limit = memory_settings.MAX_MESSAGE_BYTES
    size = len(message.content.encode("utf-8", "surrogatepass"))
    for blob in (message.content_parts, message.tool_calls, message.extra, message.metadata):
        if blob:
            size += len(json.dumps(blob, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > limit:
        raise MessageTooLarge("content", f"message is {size} bytes; the limit is {limit} (MAX_MESSAGE_BYTES)")
