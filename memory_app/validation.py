"""The rule book: what may be stored, checked in one place for every entry point.

Append, import, snapshot saves, session fields and metadata, and the cursors and budgets of
reads are all checked here; the adapter, the API, the admin, the commands and the integrations
reach these rules through the stores, never with rules of their own. Lengths come from the model
fields, sizes from ``MEMORY_APP``. Every text that will later be tokenized (message content,
summaries, pinned messages) is bounded by ``MAX_MESSAGE_BYTES``, so reading never fails on what
writing accepted.

Messages: ``role``, ``content``, ``name``, ``tool_calls``, ``tool_call_id`` (OpenAI's), and ours:
``metadata`` (object), ``remember`` (bool), ``idempotency_key`` (str), ``extra`` (object of other
OpenAI fields kept losslessly, e.g. ``refusal``). Anything else is refused, never dropped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import types
from .conf import memory_settings
from .encryption import ENCRYPTED_PREFIX
from .exceptions import (
    FieldError,
    InvalidCheckpoint,
    InvalidCursor,
    InvalidExport,
    InvalidItem,
    InvalidMessage,
    InvalidSearch,
    InvalidSession,
    InvalidSnapshot,
    MemoryStoreError,
    MessageTooLarge,
)
from .models import Checkpoint, CheckpointWrite, Item, Message, Session, Snapshot
from .types import NewMessage, SnapshotView, StoredMessage

# ---- limits ------------------------------------------------------------------------------------
ROLES = frozenset(types.ROLES)
MAX_KEY = Session._meta.get_field("key").max_length
MAX_NAMESPACE = Session._meta.get_field("namespace").max_length
MAX_TITLE = Session._meta.get_field("title").max_length
MAX_NAME = Message._meta.get_field("name").max_length
MAX_TOOL_CALL_ID = Message._meta.get_field("tool_call_id").max_length
MAX_IDEMPOTENCY_KEY = Message._meta.get_field("idempotency_key").max_length
MAX_MODEL = Snapshot._meta.get_field("model").max_length
#: The largest cursor (PostgreSQL's bigint).
MAX_CHECKPOINT_NS = Checkpoint._meta.get_field("checkpoint_ns").max_length
MAX_CHECKPOINT_ID = Checkpoint._meta.get_field("checkpoint_id").max_length
MAX_RUN_ID = Checkpoint._meta.get_field("run_id").max_length
MAX_TASK_ID = CheckpointWrite._meta.get_field("task_id").max_length
MAX_TASK_PATH = CheckpointWrite._meta.get_field("task_path").max_length
MAX_CHANNEL = CheckpointWrite._meta.get_field("channel").max_length
MAX_ITEM_NAMESPACE = Item._meta.get_field("namespace").max_length
MAX_ITEM_KEY = Item._meta.get_field("key").max_length
ITEM_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
MAX_CURSOR = 2**63 - 1
#: The largest cursor an import may set: the largest integer JSON clients (JavaScript's numbers)
#: hold exactly, and far enough below MAX_CURSOR that appends after an import cannot overflow.
MAX_IMPORTED_CURSOR = 2**53 - 1
#: The largest count (token budgets, versions, token counts: PostgreSQL's integer).
MAX_COUNT = 2**31 - 1

ALLOWED_KEYS = frozenset(
    {
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "metadata",
        "remember",
        "idempotency_key",
        "extra",
    }
)
# Other fields OpenAI puts on chat messages. Accepted at the top level and kept in ``extra``,
# so a message read back (``as_openai()`` spreads ``extra``) can be stored or pinned again.
OPENAI_EXTRA_KEYS = frozenset(
    {"refusal", "audio", "function_call", "annotations", "reasoning_content"}
)
#: Fields the store adds to a message it returns or exports: ``extra`` may not use them, or the
#: value sent would be silently replaced there (and lost by an export round trip).
STORE_KEYS = frozenset({"cursor", "tokens", "created_at"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})

EXPORT_FORMAT = "memory_app.session"
EXPORT_VERSION = 1
EXPORT_KEYS = frozenset({"format", "version", "session", "messages", "snapshots"})
EXPORT_SESSION_KEYS = frozenset(
    {
        "id",
        "key",
        "namespace",
        "title",
        "metadata",
        "owner",
        "created_at",
        "updated_at",
        "expires_at",
        "next_seq",
    }
)
EXPORT_MESSAGE_KEYS = ALLOWED_KEYS | OPENAI_EXTRA_KEYS | STORE_KEYS
EXPORT_SNAPSHOT_KEYS = frozenset(
    {"version", "upto", "summary", "pinned", "model", "metadata", "created_at"}
)

SCOPES = ("session", "owner")
MODES = types.SEARCH_MODES
MAX_SEARCH_LIMIT = 1000
MAX_QUERY_CHARS = 4000


def _size(value: Any) -> int:
    """Bytes of ``value`` as stored (UTF-8 text, or compact JSON)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(
        json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass"
        )
    )


# ---- plain values ------------------------------------------------------------------------------
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
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    if isinstance(value, (dict, list, tuple)) and depth_left <= 0:
        depth = memory_settings.MAX_JSON_DEPTH
        return f"must not be nested more than {depth} levels deep (MAX_JSON_DEPTH)"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return "object keys must be strings"
            if problem := _unstorable(key, depth_left) or _unstorable(item, depth_left - 1):
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for item in value:
            if problem := _unstorable(item, depth_left - 1):
                return problem
        return None
    return f"must be JSON data, not {type(value).__name__}"


def check_metadata(
    value: Any, *, field: str = "metadata", error: type[Exception] = InvalidSession
) -> dict:
    """A metadata object: JSON-storable, at most ``MAX_METADATA_BYTES``."""
    if not isinstance(value, dict):
        raise error(field, "must be an object")
    if problem := unstorable(value):
        raise error(field, problem)
    limit = memory_settings.MAX_METADATA_BYTES
    if (size := _size(value)) > limit:
        raise error(field, f"is {size} bytes; the limit is {limit} (MAX_METADATA_BYTES)")
    return value


def check_cursor(value: Any, name: str = "cursor", *, maximum: int = MAX_CURSOR) -> int:
    """A cursor, count or budget: a non-negative integer (digits in a string are accepted)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            raise InvalidCursor(f"{name} must be an integer, not {value!r}", field=name)
    if value < 0:
        raise InvalidCursor(f"{name} must not be negative", field=name)
    if value > maximum:
        # Beyond the database's integer types: refuse it here rather than fail in SQL.
        raise InvalidCursor(f"{name} must be at most {maximum}", field=name)
    return value


def check_count(value: Any, name: str) -> int:
    """A count or token budget (PostgreSQL's integer range)."""
    return check_cursor(value, name, maximum=MAX_COUNT)


# ---- sessions ----------------------------------------------------------------------------------
_UNSET: Any = object()


def check_session_fields(
    *,
    key: Any = _UNSET,
    namespace: Any = _UNSET,
    title: Any = _UNSET,
    metadata: Any = _UNSET,
    expires_at: Any = _UNSET,
) -> None:
    """The fields a session is created or updated with (only those given are checked)."""
    for field, value, longest in (("key", key, MAX_KEY), ("namespace", namespace, MAX_NAMESPACE)):
        if value is _UNSET:
            continue
        if not isinstance(value, str) or not value.strip() or len(value) > longest:
            raise InvalidSession(
                field, f"must be a non-empty string of at most {longest} characters"
            )
        if problem := unstorable(value):
            raise InvalidSession(field, problem)
    if title is not _UNSET and title is not None:
        if not isinstance(title, str) or len(title) > MAX_TITLE:
            raise InvalidSession("title", f"must be a string of at most {MAX_TITLE} characters")
        if problem := unstorable(title):
            raise InvalidSession("title", problem)
    if metadata is not _UNSET and metadata is not None:
        check_metadata(metadata)
    if expires_at is not _UNSET and expires_at is not None:
        if not isinstance(expires_at, dt.datetime):
            raise InvalidSession("expires_at", "must be a date-time or null")
        if timezone.is_naive(expires_at):
            raise InvalidSession("expires_at", "must carry a time zone")


def check_metadata_key(key: Any, value: Any) -> None:
    """One ``set_meta(key, value)`` change (the whole object is checked after it is applied)."""
    if not isinstance(key, str) or not key:
        raise InvalidSession("metadata", "a metadata key must be a non-empty string")
    if problem := unstorable(key) or unstorable(value):
        raise InvalidSession("metadata", problem)


# ---- checkpoints (LangGraph state) --------------------------------------------------------------
def _checkpoint_text(value: Any, field: str, longest: int, *, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > longest or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise InvalidCheckpoint(field, f"must be {kind} of at most {longest} characters")
    if problem := unstorable(value):
        raise InvalidCheckpoint(field, problem)
    return value


def check_thread_id(value: Any) -> str:
    """A thread id (the session key it is stored under): a non-empty string or an integer."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_KEY:
        raise InvalidCheckpoint(
            "thread_id", f"must be a non-empty string of at most {MAX_KEY} characters"
        )
    if problem := unstorable(value):
        raise InvalidCheckpoint("thread_id", problem)
    return value


def check_checkpoint_ref(checkpoint_ns: Any, checkpoint_id: Any = None) -> tuple[str, str | None]:
    """A checkpoint namespace and (optional) id as a config names them."""
    ns = _checkpoint_text(
        "" if checkpoint_ns is None else checkpoint_ns, "checkpoint_ns", MAX_CHECKPOINT_NS
    )
    if checkpoint_id is not None:
        checkpoint_id = _checkpoint_text(
            checkpoint_id, "checkpoint_id", MAX_CHECKPOINT_ID, empty=False
        )
    return ns, checkpoint_id


def check_checkpoint(checkpoint: Any, metadata: Any) -> tuple[dict, dict, str]:
    """A checkpoint (without channel values) and its metadata, as JSON the database stores;
    returns them with the metadata's run id ("" without one)."""
    if not isinstance(checkpoint, dict):
        raise InvalidCheckpoint("checkpoint", "must be a checkpoint (a dict)")
    _checkpoint_text(checkpoint.get("id"), "checkpoint.id", MAX_CHECKPOINT_ID, empty=False)
    if problem := unstorable(checkpoint):
        raise InvalidCheckpoint("checkpoint", problem)
    check_metadata(metadata, error=InvalidCheckpoint)
    run_id = metadata.get("run_id") or ""
    if not isinstance(run_id, str):
        run_id = str(run_id)
    return checkpoint, metadata, _checkpoint_text(run_id, "metadata.run_id", MAX_RUN_ID)


def check_channel(channel: Any) -> str:
    """A channel name (of a checkpoint's values or a pending write)."""
    return _checkpoint_text(channel, "channel", MAX_CHANNEL, empty=False)


def check_write(task_id: Any, task_path: Any, channel: Any) -> None:
    """The task and channel of one pending write."""
    _checkpoint_text(task_id, "task_id", MAX_TASK_ID, empty=False)
    _checkpoint_text(task_path, "task_path", MAX_TASK_PATH)
    check_channel(channel)


# ---- store items (an owner's namespaced values) --------------------------------------------------
def check_item_namespace(
    namespace: Any, *, field: str = "namespace", empty: bool = False, wildcard: bool = False
) -> tuple[str, ...]:
    """A namespace: a tuple (or list) of non-empty labels without ``.`` or NUL, at most
    ``MAX_ITEM_NAMESPACE`` characters joined; ``empty`` allows ``()``, ``wildcard`` allows
    ``*`` labels (listing)."""
    if isinstance(namespace, str) and wildcard:
        namespace = (namespace,)
    if not isinstance(namespace, (tuple, list)) or (not namespace and not empty):
        raise InvalidItem(field, "must be a non-empty tuple of labels")
    for label in namespace:
        if not isinstance(label, str) or not label:
            raise InvalidItem(field, f"labels must be non-empty strings, not {label!r}")
        if "." in label:
            raise InvalidItem(field, f"labels must not contain '.', got {label!r}")
        if problem := unstorable(label):
            raise InvalidItem(field, problem)
    if len(".".join(namespace)) > MAX_ITEM_NAMESPACE:
        raise InvalidItem(field, f"must be at most {MAX_ITEM_NAMESPACE} characters joined")
    return tuple(namespace)


def check_item_key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_ITEM_KEY:
        raise InvalidItem("key", f"must be a non-empty string of at most {MAX_ITEM_KEY} characters")
    if problem := unstorable(key):
        raise InvalidItem("key", problem)
    return key


def check_item_value(value: Any) -> dict:
    """An item's value: a JSON object, at most ``MAX_MESSAGE_BYTES``."""
    if not isinstance(value, dict):
        raise InvalidItem("value", "must be a JSON object (a dict)")
    if problem := unstorable(value):
        raise InvalidItem("value", problem)
    limit = memory_settings.MAX_MESSAGE_BYTES
    if (size := _size(value)) > limit:
        raise InvalidItem("value", f"is {size} bytes; the limit is {limit} (MAX_MESSAGE_BYTES)")
    return value


def check_ttl(value: Any) -> float | None:
    """A TTL in minutes: a positive finite number, or ``None`` (never expires)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidItem("ttl", f"must be a positive number of minutes or None, not {value!r}")
    return float(value)


def check_item_filter(value: Any) -> dict:
    """A search filter: ``{key: value}`` or ``{key: {"$gt": n, ...}}`` on top-level value keys."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidItem("filter", "must be a dict of value keys and conditions")
    if problem := unstorable(value):
        raise InvalidItem("filter", problem)
    for key, wanted in value.items():
        if not key or "__" in key:
            raise InvalidItem("filter", f"keys must be non-empty and without '__', got {key!r}")
        if isinstance(wanted, dict) and any(k.startswith("$") for k in wanted):
            unknown = sorted(k for k in wanted if k not in ITEM_OPERATORS)
            if unknown:
                raise InvalidItem(
                    "filter",
                    f"unknown operator(s) {', '.join(unknown)}; known: {', '.join(ITEM_OPERATORS)}",
                )
    return value


# ---- messages ----------------------------------------------------------------------------------
#: The common shape, ``{"role": ..., "content": "..."}``, for which ``check_message`` takes a
#: short cut (the same rules, only the ones such a message can break).
_PLAIN_KEYS = frozenset({"role", "content"})
_PLAIN_ROLES = frozenset({"system", "user", "assistant"})


def _plain(data: Any) -> NewMessage | None:
    """The common message, checked in one pass: a dict with just a role (not ``tool``) and a
    string content that is storable, unmarked and within ``MAX_MESSAGE_BYTES``. ``None`` for
    anything else, which the full rule book checks (and names the fault of)."""
    if type(data) is not dict or data.keys() != _PLAIN_KEYS:
        return None
    role, text = data["role"], data["content"]
    if type(text) is not str or type(role) is not str or role not in _PLAIN_ROLES:
        return None
    if "\x00" in text or text.startswith(ENCRYPTED_PREFIX):
        return None
    try:
        size = len(text.encode("utf-8"))  # also refuses lone surrogates
    except UnicodeEncodeError:
        return None
    if size > memory_settings.MAX_MESSAGE_BYTES:
        return None
    return NewMessage(role=role, content=text, content_parts=None)


def check_message(data: Any) -> NewMessage:
    """One OpenAI chat message, validated into what the log stores; ``InvalidMessage`` names
    the field at fault."""
    if (plain := _plain(data)) is not None:
        return plain
    if not isinstance(data, dict):
        raise InvalidMessage("message", f"must be an object, not {type(data).__name__}")
    promoted = {k: data[k] for k in OPENAI_EXTRA_KEYS & set(data)}
    if promoted:
        if data.get("extra") is not None and not isinstance(data.get("extra"), dict):
            raise InvalidMessage("extra", "must be an object")
        data = {k: v for k, v in data.items() if k not in promoted}
        data["extra"] = {**promoted, **(data.get("extra") or {})}
    unknown = sorted(str(k) for k in set(data) - ALLOWED_KEYS)
    if unknown:
        raise InvalidMessage(unknown[0], "unknown field (put other OpenAI fields in 'extra')")
    for key, value in data.items():
        if problem := unstorable(value):
            raise InvalidMessage(key, problem)

    role = data.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidMessage("role", f"must be one of {', '.join(sorted(ROLES))}; got {role!r}")

    tool_calls = _tool_calls(data.get("tool_calls"), role)
    text, parts = _content(data.get("content", None), role, has_tool_calls=bool(tool_calls))

    tool_call_id = _optional(data, "tool_call_id", str, "")
    if role == "tool":
        if not tool_call_id:
            raise InvalidMessage(
                "tool_call_id", "a tool message needs the id of the call it answers"
            )
    elif tool_call_id:
        raise InvalidMessage("tool_call_id", "only tool messages carry a tool_call_id")
    if len(tool_call_id) > MAX_TOOL_CALL_ID:
        raise InvalidMessage("tool_call_id", f"longer than {MAX_TOOL_CALL_ID} characters")

    name = _optional(data, "name", str, "")
    if len(name) > MAX_NAME:
        raise InvalidMessage("name", f"must be a string of at most {MAX_NAME} characters")

    metadata = _optional(data, "metadata", dict, {})
    if metadata:
        check_metadata(metadata, error=InvalidMessage)
    extra = _optional(data, "extra", dict, None) or None
    if extra is not None:
        clash = set(extra) & (ALLOWED_KEYS | STORE_KEYS)
        if clash:
            raise InvalidMessage("extra", f"may not redefine {sorted(clash)[0]!r}")
    remember = data.get("remember", False)
    if not isinstance(remember, bool):
        raise InvalidMessage("remember", "must be true or false")
    key = data.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY):
        raise InvalidMessage(
            "idempotency_key",
            f"must be a non-empty string of at most {MAX_IDEMPOTENCY_KEY} characters",
        )

    if text.startswith(ENCRYPTED_PREFIX):
        raise InvalidMessage(
            "content", f"must not start with {ENCRYPTED_PREFIX!r} (marks encrypted text)"
        )
    message = NewMessage(
        role=role,
        content=text,
        content_parts=parts,
        name=name,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        extra=extra,
        metadata=metadata,
        remember=remember,
        idempotency_key=key,
    )
    _check_size(message)
    return message


def check_messages(batch: Any) -> list[NewMessage]:
    """A batch for one atomic append: a non-empty list of at most ``MAX_BATCH_SIZE`` messages,
    idempotency keys unique within it. Errors carry the message's ``index``."""
    if isinstance(batch, (str, bytes, dict)) or not isinstance(batch, Iterable):
        # Iterable or not, none of these is a batch (a string would become one per character).
        raise InvalidMessage("messages", "must be a list of messages")
    batch = list(batch)
    if not batch:
        raise InvalidMessage("messages", "must not be empty")
    limit = memory_settings.MAX_BATCH_SIZE
    if len(batch) > limit:
        raise InvalidMessage("messages", f"at most {limit} messages per batch; got {len(batch)}")
    validated = []
    for index, item in enumerate(batch):
        try:
            validated.append(check_message(item))
        except InvalidMessage as err:
            raise err.at(index) from None
    keys = [m.idempotency_key for m in validated if m.idempotency_key]
    if len(keys) != len(set(keys)):
        raise InvalidMessage("idempotency_key", "repeated within one batch")
    return validated


def _optional(data: dict, key: str, kind: type, default: Any) -> Any:
    """``data[key]`` if it is a ``kind``; ``default`` if absent or null; else ``InvalidMessage``."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise InvalidMessage(key, "must be " + ("a string" if kind is str else "an object"))
    return value


def _content(content: Any, role: str, *, has_tool_calls: bool) -> tuple[str, list | None]:
    if content is None:
        if role == "assistant" and has_tool_calls:
            return "", None
        article = "an" if role[:1] in "aeiou" else "a"
        raise InvalidMessage("content", f"{article} {role} message needs content")
    if isinstance(content, str):
        return content, None
    if isinstance(content, list):
        if not content:
            raise InvalidMessage("content", "a list of content parts must not be empty")
        texts = []
        for i, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or not isinstance(part.get("type"), str)
                or part["type"] not in PART_TYPES
            ):
                raise InvalidMessage(
                    "content",
                    f"part {i} must be an object with type one of {', '.join(sorted(PART_TYPES))}",
                )
            if part["type"] in ("text", "refusal"):
                value = part.get(part["type"])
                if not isinstance(value, str):
                    raise InvalidMessage("content", f"part {i} needs a string {part['type']!r}")
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
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_TOOL_CALL_ID:
            raise InvalidMessage(
                "tool_calls", f"call {i} needs a string id of at most {MAX_TOOL_CALL_ID} characters"
            )
        if call_id in seen:
            raise InvalidMessage("tool_calls", f"call {i} repeats id {call_id!r}")
        seen.add(call_id)
        if call.get("type", "function") != "function":
            raise InvalidMessage("tool_calls", f"call {i}: type must be 'function'")
        function = call.get("function")
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise InvalidMessage("tool_calls", f"call {i} needs function.name")
        # OpenAI refuses a call without arguments when the history is sent back: "{}" for none.
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise InvalidMessage(
                "tool_calls",
                f"call {i} needs function.arguments, a JSON string ('{{}}' for none)",
            )
        if arguments.startswith(ENCRYPTED_PREFIX):
            raise InvalidMessage(
                "tool_calls",
                f"call {i}: function.arguments must not start with "
                f"{ENCRYPTED_PREFIX!r} (marks encrypted text)",
            )
    return tool_calls


def _check_size(message: NewMessage) -> None:
    limit = memory_settings.MAX_MESSAGE_BYTES
    sizes = {"content": _size(message.content)}
    for name in ("content_parts", "tool_calls", "extra", "metadata"):
        value = getattr(message, name)
        if value:
            sizes[name] = _size(value)
    total = sum(sizes.values()) - (sizes["content"] if "content_parts" in sizes else 0)
    if total > limit:
        largest = max(sizes, key=sizes.__getitem__)
        raise MessageTooLarge(
            "content" if largest == "content_parts" else largest,
            f"message is {total} bytes; the limit is {limit} (MAX_MESSAGE_BYTES)",
        )


# ---- snapshots ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NewSnapshot:
    """A validated snapshot, ready for the compare-and-swap save."""

    summary: str
    upto: int
    expected_version: int | None
    pinned: list[dict]
    model: str
    metadata: dict


def check_snapshot(
    summary: Any,
    *,
    upto: Any,
    prev: Any = None,
    pinned: Any = (),
    model: Any = "",
    metadata: Any = None,
) -> NewSnapshot:
    """A summary standing for every message up to ``upto``, its pinned messages and metadata."""
    if not isinstance(summary, str) or not summary.strip():
        raise InvalidSnapshot("summary", "must be a non-empty string")
    if problem := unstorable(summary):
        raise InvalidSnapshot("summary", problem)
    limit = memory_settings.MAX_MESSAGE_BYTES
    if (size := _size(summary)) > limit:
        raise InvalidSnapshot(
            "summary", f"is {size} bytes; the limit is {limit} (MAX_MESSAGE_BYTES)"
        )
    if not isinstance(model, str) or len(model) > MAX_MODEL:
        raise InvalidSnapshot("model", f"must be a string of at most {MAX_MODEL} characters")
    if problem := unstorable(model):
        raise InvalidSnapshot("model", problem)
    metadata = {} if metadata is None else check_metadata(metadata, error=InvalidSnapshot)
    upto = check_cursor(upto, "upto")
    expected = prev.version if isinstance(prev, SnapshotView) else prev
    if expected is not None and (
        isinstance(expected, bool)
        or not isinstance(expected, int)
        or not 1 <= expected <= MAX_COUNT
    ):
        raise InvalidSnapshot("prev", "must be a snapshot, its version, or None")
    return NewSnapshot(
        summary=summary,
        upto=upto,
        expected_version=expected,
        pinned=check_pinned(pinned),
        model=model,
        metadata=metadata,
    )


def check_pinned(pinned: Any) -> list[dict]:
    """Pinned messages (OpenAI dicts or stored messages), each valid as a message, together at
    most ``MAX_MESSAGE_BYTES`` and ``MAX_PINNED`` messages: they go into every window."""
    if isinstance(pinned, (str, bytes, dict)) or not isinstance(pinned, Iterable):
        raise InvalidSnapshot("pinned", "must be a list of messages")
    pinned = list(pinned)
    if len(pinned) > memory_settings.MAX_PINNED:
        raise InvalidSnapshot(
            "pinned", f"at most {memory_settings.MAX_PINNED} messages (MAX_PINNED)"
        )
    dicts = []
    for index, item in enumerate(pinned):
        if isinstance(item, StoredMessage):
            item = item.as_openai()
        try:
            dicts.append(check_message(item).as_openai())
        except InvalidMessage as err:
            raise InvalidSnapshot(f"pinned[{index}].{err.field}", err.reason) from None
    limit = memory_settings.MAX_MESSAGE_BYTES
    if dicts and (size := _size(dicts)) > limit:
        raise InvalidSnapshot(
            "pinned", f"is {size} bytes; the limit is {limit} (MAX_MESSAGE_BYTES)"
        )
    return dicts


def check_keep_recent(value: Any) -> int:
    """How many newest messages compaction leaves out (default ``SUMMARIZE_KEEP_RECENT``)."""
    if value is None:
        value = memory_settings.SUMMARIZE_KEEP_RECENT
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise InvalidSnapshot("keep_recent", f"must be a non-negative integer, not {value!r}")
    return value


# ---- search ------------------------------------------------------------------------------------
def check_search_filters(scope: Any, roles: Any, mode: Any) -> tuple[str, list[str] | None, str]:
    if scope not in SCOPES:
        raise InvalidSearch("scope", f"must be one of {', '.join(SCOPES)}")
    if roles is not None:
        if isinstance(roles, str) or not isinstance(roles, Iterable):
            raise InvalidSearch("roles", "must be a list of roles")
        roles = list(roles)
        bad = [r for r in roles if not isinstance(r, str) or r not in ROLES]
        if bad or not roles:
            raise InvalidSearch("roles", f"must be a non-empty list of {', '.join(sorted(ROLES))}")
    mode = mode or memory_settings.SEARCH_MODE
    if mode not in MODES:
        raise InvalidSearch("mode", f"must be one of {', '.join(MODES)}")
    return scope, roles, mode


def check_search(query: Any, limit: Any, scope: Any, roles: Any, mode: Any) -> tuple:
    if not isinstance(query, str) or not query.strip():
        raise InvalidSearch("query", "must be a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidSearch("query", f"must be at most {MAX_QUERY_CHARS} characters")
    if problem := unstorable(query):
        raise InvalidSearch("query", problem)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SEARCH_LIMIT:
        raise InvalidSearch("limit", f"must be an integer from 1 to {MAX_SEARCH_LIMIT}")
    return (query, limit, *check_search_filters(scope, roles, mode))


def check_recall_k(value: Any, field: str = "recall_k") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEARCH_LIMIT:
        raise InvalidSearch(field, f"must be an integer from 0 to {MAX_SEARCH_LIMIT}")
    return value


# ---- recall filters ------------------------------------------------------------------------------
#: Operators of a metadata condition in recall filters.
FILTER_OPERATORS = ("$eq", "$ne", "$in", "$gt", "$gte", "$lt", "$lte")
FILTER_KEYS = frozenset({"metadata", "created_after", "created_before", "namespace", "session"})


@dataclass(frozen=True)
class RecallFilters:
    """Conditions a search applies before ranking, on messages and memories alike:
    ``metadata`` conditions (``{key: value}`` or ``{key: {"$gt": n, ...}}``; numbers compare as
    numbers, strings (ISO dates too) as text), a ``created_at`` range, a namespace and a session."""

    metadata: dict = dataclasses.field(default_factory=dict)
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    namespace: str | None = None
    session: Any = None

    def __bool__(self) -> bool:
        return bool(
            self.metadata
            or self.created_after
            or self.created_before
            or self.namespace is not None
            or self.session is not None
        )


def check_datetime(value: Any, field: str, error: type[FieldError] = None) -> dt.datetime:
    """An aware date-time (a ``datetime``, or an ISO 8601 string; naive ones are UTC)."""
    error = error or InvalidSearch
    parsed = value
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value)
            if parsed is None and len(value) == 10:  # a date alone: its first instant
                parsed = parse_datetime(value + "T00:00:00")
        except ValueError:
            parsed = None
    if not isinstance(parsed, dt.datetime):
        raise error(field, f"must be an ISO 8601 date-time, not {value!r}")
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed


def check_recall_filters(value: Any) -> RecallFilters:
    """``filters`` of a search (``None``: none), checked whole before anything is read."""
    if value is None or isinstance(value, RecallFilters):
        return value or RecallFilters()
    if not isinstance(value, dict):
        raise InvalidSearch("filters", "must be an object")
    unknown = sorted(set(value) - FILTER_KEYS)
    if unknown:
        raise InvalidSearch(
            "filters",
            f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(FILTER_KEYS))}",
        )
    metadata = value.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidSearch("filters.metadata", "must be an object of keys and conditions")
    if problem := unstorable(metadata):
        raise InvalidSearch("filters.metadata", problem)
    for key, wanted in metadata.items():
        if not key or "__" in key or len(key) > 255:
            raise InvalidSearch(
                "filters.metadata", f"keys must be 1-255 characters without '__', got {key!r}"
            )
        if isinstance(wanted, dict) and any(str(k).startswith("$") for k in wanted):
            unknown = sorted(k for k in wanted if k not in FILTER_OPERATORS)
            if unknown:
                raise InvalidSearch(
                    "filters.metadata",
                    f"unknown operator(s) {', '.join(unknown)}; known: "
                    f"{', '.join(FILTER_OPERATORS)}",
                )
            if "$in" in wanted and not isinstance(wanted["$in"], list):
                raise InvalidSearch("filters.metadata", f"{key}: $in takes a list")
            for op in ("$gt", "$gte", "$lt", "$lte"):
                operand = wanted.get(op)
                if op in wanted and (
                    isinstance(operand, bool) or not isinstance(operand, (int, float, str))
                ):
                    raise InvalidSearch(
                        "filters.metadata", f"{key}: {op} takes a number or a string"
                    )
    after = value.get("created_after")
    before = value.get("created_before")
    namespace = value.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or not namespace or unstorable(namespace)
    ):
        raise InvalidSearch("filters.namespace", "must be a non-empty string")
    session = value.get("session")
    if session is not None:
        try:
            session = uuid.UUID(str(session))
        except ValueError:
            raise InvalidSearch(
                "filters.session", f"must be a session id, not {session!r}"
            ) from None
    return RecallFilters(
        metadata=metadata,
        created_after=None if after is None else check_datetime(after, "filters.created_after"),
        created_before=None if before is None else check_datetime(before, "filters.created_before"),
        namespace=namespace,
        session=session,
    )


# ---- learned memory and memory blocks ------------------------------------------------------------
#: A memory block's name: letters, digits, ``_`` and ``-``.
BLOCK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
BLOCK_SCOPES = ("owner", "session")


def check_memory_text(value: Any, field: str = "text") -> str:
    """A fact: a non-empty string of at most ``MAX_MESSAGE_BYTES``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidItem(field, "must be a non-empty string")
    limit = memory_settings.MAX_MESSAGE_BYTES
    if _size(value) > limit:
        raise InvalidItem(field, f"must be at most {limit} bytes (MAX_MESSAGE_BYTES)")
    if problem := unstorable(value):
        raise InvalidItem(field, problem)
    return value.strip()


def check_importance(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidItem("importance", f"must be a number from 0 to 1, not {value!r}")
    return float(value)


def check_memory_metadata(value: Any) -> dict:
    return check_metadata({} if value is None else value, error=InvalidItem)


def check_block(name: Any, text: Any = "") -> tuple[str, str]:
    """A memory block's name and text (at most ``MEMORY_BLOCK_MAX_CHARS`` characters)."""
    if not isinstance(name, str) or not BLOCK_NAME.match(name):
        raise InvalidItem("name", "must be 1-64 letters, digits, '_' or '-'")
    if not isinstance(text, str):
        raise InvalidItem("text", "must be a string")
    limit = memory_settings.MEMORY_BLOCK_MAX_CHARS
    if len(text) > limit:
        raise InvalidItem(
            "text", f"is {len(text)} characters; a block holds {limit} (MEMORY_BLOCK_MAX_CHARS)"
        )
    if problem := unstorable(text):
        raise InvalidItem("text", problem)
    return name, text


# ---- imports -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImportedMessage:
    cursor: int
    message: NewMessage
    created_at: dt.datetime | None


@dataclass(frozen=True)
class ImportedSnapshot:
    version: int
    upto: int
    summary: str
    pinned: list[dict]
    model: str
    metadata: dict
    created_at: dt.datetime | None


@dataclass(frozen=True)
class ImportPlan:
    """A session export, checked whole before anything is written."""

    key: str
    namespace: str
    title: str
    metadata: dict
    owner_id: Any
    expires_at: dt.datetime | None
    created_at: dt.datetime | None
    next_seq: int
    messages: list[ImportedMessage]
    snapshots: list[ImportedSnapshot]


def _unknown(data: dict, allowed: frozenset, where: str) -> None:
    unknown = sorted(str(k) for k in set(data) - allowed)
    if unknown:
        raise InvalidExport(f"{where}{unknown[0]}: unknown field", field=f"{where}{unknown[0]}")


def _export_int(value: Any, where: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidExport(
            f"{where} must be an integer from {low} to {high}, not {value!r}", field=where
        )
    return value


def _export_datetime(value: Any, where: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well-formed but impossible, e.g. month 13
        parsed = None
    if parsed is None:
        raise InvalidExport(f"{where} must be an ISO 8601 date-time, not {value!r}", field=where)
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        # Stored in UTC: refuse what falls outside Python's years 1..9999 there.
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidExport(f"{where} is out of range: {value!r}", field=where) from None


def _as_export_error(err: MemoryStoreError, where: str) -> InvalidExport:
    field = getattr(err, "field", None)
    reason = getattr(err, "reason", None) or str(err)
    return InvalidExport(
        f"{where}{field}: {reason}" if field else f"{where}{reason}",
        field=f"{where}{field}" if field else where.rstrip(": .") or None,
    )


def check_import(
    data: Any, *, owner_id: Any, key: str | None = None, namespace: str | None = None
) -> ImportPlan:
    """An ``export()`` to restore as a new session, validated exactly as the same messages,
    snapshots and session fields would be on append, save and create. Unknown keys at any level
    are refused; token counts are recounted, never taken from the export. ``owner_id`` is the
    owner to import for (the caller resolves its default)."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise InvalidExport(f"not a {EXPORT_FORMAT} export", field="format")
    if data.get("version") != EXPORT_VERSION:
        raise InvalidExport(f"unsupported export version {data.get('version')!r}", field="version")
    _unknown(data, EXPORT_KEYS, "")
    meta = data.get("session")
    raw_messages = data.get("messages", [])
    raw_snapshots = data.get("snapshots", [])
    if not isinstance(meta, dict):
        raise InvalidExport("session must be an object", field="session")
    if not isinstance(raw_messages, list):
        raise InvalidExport("messages must be a list", field="messages")
    if not isinstance(raw_snapshots, list):
        raise InvalidExport("snapshots must be a list", field="snapshots")
    _unknown(meta, EXPORT_SESSION_KEYS, "session.")
    key = key if key is not None else meta.get("key")
    if key is None:
        raise InvalidExport("missing field: session.key", field="session.key")
    namespace = namespace or meta.get("namespace") or memory_settings.DEFAULT_NAMESPACE
    title = meta.get("title") or ""
    metadata = meta.get("metadata") or {}
    try:
        check_session_fields(key=key, namespace=namespace, title=title, metadata=metadata)
    except InvalidSession as err:
        raise _as_export_error(err, "session.") from None
    expires_at = _export_datetime(meta.get("expires_at"), "session.expires_at")
    created_at = _export_datetime(meta.get("created_at"), "session.created_at")

    messages = []
    for index, raw in enumerate(raw_messages):
        where = f"messages[{index}]."
        if not isinstance(raw, dict):
            raise InvalidExport(f"messages[{index}] is not an object", field=f"messages[{index}]")
        _unknown(raw, EXPORT_MESSAGE_KEYS, where)
        raw = dict(raw)
        cursor = _export_int(
            raw.pop("cursor", None), f"{where}cursor", low=1, high=MAX_IMPORTED_CURSOR
        )
        tokens = raw.pop("tokens", None)
        if tokens is not None:  # checked, then recounted: counts drive windows and summaries
            _export_int(tokens, f"{where}tokens", low=0, high=MAX_COUNT)
        created = _export_datetime(raw.pop("created_at", None), f"{where}created_at")
        if raw.get("idempotency_key") is None:
            raw.pop("idempotency_key", None)
        try:
            message = check_message(raw)
        except InvalidMessage as err:
            raise _as_export_error(err, where) from None
        messages.append(ImportedMessage(cursor=cursor, message=message, created_at=created))
    cursors = [m.cursor for m in messages]
    if cursors != sorted(set(cursors)):
        raise InvalidExport("message cursors must be unique and ascending", field="messages")
    keys = [m.message.idempotency_key for m in messages if m.message.idempotency_key]
    if len(keys) != len(set(keys)):
        raise InvalidExport("message idempotency keys must be unique", field="messages")
    if meta.get("next_seq") is None:
        next_seq = cursors[-1] + 1 if cursors else 1
    else:
        next_seq = _export_int(
            meta["next_seq"], "session.next_seq", low=1, high=MAX_IMPORTED_CURSOR
        )
    if cursors and next_seq <= cursors[-1]:
        raise InvalidExport(
            "session.next_seq must lie past the last message", field="session.next_seq"
        )

    snapshots = []
    for index, snap in enumerate(raw_snapshots):
        where = f"snapshots[{index}]."
        if not isinstance(snap, dict):
            raise InvalidExport(f"snapshots[{index}] is not an object", field=f"snapshots[{index}]")
        _unknown(snap, EXPORT_SNAPSHOT_KEYS, where)
        version = _export_int(snap.get("version"), f"{where}version", low=1, high=MAX_COUNT)
        upto = _export_int(snap.get("upto"), f"{where}upto", low=1, high=MAX_IMPORTED_CURSOR)
        try:
            checked = check_snapshot(
                snap.get("summary"),
                upto=upto,
                pinned=snap.get("pinned") or [],
                model=snap.get("model") or "",
                metadata=snap.get("metadata") or {},
            )
        except (InvalidSnapshot, InvalidCursor) as err:
            raise _as_export_error(err, where) from None
        created = _export_datetime(snap.get("created_at"), f"{where}created_at")
        snapshots.append(
            ImportedSnapshot(
                version=version,
                upto=upto,
                summary=checked.summary,
                pinned=checked.pinned,
                model=checked.model,
                metadata=checked.metadata,
                created_at=created,
            )
        )
    snapshots.sort(key=lambda s: s.version)
    last_upto, last_version = 0, 0
    for snap in snapshots:
        if snap.version == last_version:
            raise InvalidExport(f"snapshot version {snap.version} appears twice", field="snapshots")
        if snap.upto <= last_upto or snap.upto >= next_seq:
            raise InvalidExport(
                f"snapshot {snap.version}: upto {snap.upto} out of order or beyond the log",
                field="snapshots",
            )
        last_upto, last_version = snap.upto, snap.version
    return ImportPlan(
        key=key,
        namespace=namespace,
        title=title,
        metadata=metadata,
        owner_id=owner_id,
        expires_at=expires_at,
        created_at=created_at,
        next_seq=next_seq,
        messages=messages,
        snapshots=snapshots,
    )
