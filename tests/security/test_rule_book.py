"""One table of hostile inputs, driven through every entry point.

Every case of ``HOSTILE`` is sent through each entry point that can carry it: the adapter
(``Memory`` / ``SessionMemory``), the REST API, the admin (forms, the transcript, actions), the
management commands, the LangChain and Agents SDK classes, and import (Python and API). For each
one the test asserts:

- the answer: a typed error from ``memory_app.exceptions`` naming the field at fault (Python), a
  4xx JSON body with ``code`` and ``field`` (API, never a 5xx), one ``CommandError`` line
  (commands), an error message on the page (admin, never a 500);
- nothing stored or changed: every session's export and the row counts are the same before and
  after;
- every session still readable: ``window()``, ``window(max_tokens=1000)``, ``context("x",
  max_tokens=500)``, ``export()``, and the API's ``window/`` and ``context/``.

A failing case names its entry point and its input in the test id (``[api.messages.post:
content>256KiB]``) and in the assertion message.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.messages import ERROR, get_messages
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse

from memory_app import Memory
from memory_app.exceptions import (
    IdempotencyConflict,
    InvalidCursor,
    InvalidExport,
    InvalidMessage,
    InvalidSearch,
    InvalidSession,
    InvalidSnapshot,
    MemoryStoreError,
    MessageTooLarge,
    SessionExists,
    SessionNotFound,
    TransientEmbedderError,
)
from memory_app.memory import SessionMemory
from memory_app.models import Embedding, Message, Session, Snapshot

from ..api.conftest import api_client_for, import_url, session_url, sessions_url
from .conftest import fill_owner

pytestmark = pytest.mark.django_db

API_PREFIX = "/api/memory/"


# ---- the hostile table --------------------------------------------------------------------------
def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


BIG_CONTENT = "x" * (256 * 1024 + 1)  # one byte over MAX_MESSAGE_BYTES
HUGE_SUMMARY = "z" * 2_000_000
TWO_MB = {"pad": "x" * 2_000_000}
DEEP = {"x": nested(65)}  # 66 levels with the outer object: over MAX_JSON_DEPTH (64)
NUL = "a\x00b"
GOOD = {"role": "user", "content": "hi"}


@dataclass(frozen=True)
class Case:
    """One hostile input. ``kind`` says what it is an input to; ``field`` is the field every
    entry point must name when it refuses it (a prefix: ``pinned`` matches ``pinned[0].role``)."""

    id: str
    kind: str
    value: Any
    field: str | None
    error: type[MemoryStoreError] = MemoryStoreError
    extra: dict = field(default_factory=dict)


MESSAGE_CASES = [
    Case(
        "content>256KiB",
        "message",
        {"role": "user", "content": BIG_CONTENT},
        "content",
        MessageTooLarge,
    ),
    Case(
        "content parts>256KiB",
        "message",
        {"role": "user", "content": [{"type": "text", "text": BIG_CONTENT}]},
        "content",
        MessageTooLarge,
    ),
    Case("content NUL", "message", {"role": "user", "content": NUL}, "content", InvalidMessage),
    Case(
        "content wrong type", "message", {"role": "user", "content": 5}, "content", InvalidMessage
    ),
    Case("role wrong type", "message", {"role": 5, "content": "hi"}, "role", InvalidMessage),
    Case("role unknown", "message", {"role": "wizard", "content": "hi"}, "role", InvalidMessage),
    Case("name>128", "message", {**GOOD, "name": "n" * 129}, "name", InvalidMessage),
    Case("name NUL", "message", {**GOOD, "name": NUL}, "name", InvalidMessage),
    Case("metadata 2MB", "message", {**GOOD, "metadata": TWO_MB}, "metadata", InvalidMessage),
    Case("metadata deep", "message", {**GOOD, "metadata": DEEP}, "metadata", InvalidMessage),
    Case(
        "metadata wrong type",
        "message",
        {**GOOD, "metadata": ["a", "b"]},
        "metadata",
        InvalidMessage,
    ),
    Case("metadata NUL key", "message", {**GOOD, "metadata": {NUL: 1}}, "metadata", InvalidMessage),
    Case("extra deep", "message", {**GOOD, "extra": {"audio": DEEP}}, "extra", InvalidMessage),
    Case("unknown key foo", "message", {**GOOD, "foo": "bar"}, "foo", InvalidMessage),
    Case(
        "unknown key embedding",
        "message",
        {**GOOD, "embedding": [0.1, 0.2, 0.3]},
        "embedding",
        InvalidMessage,
    ),
    Case("remember wrong type", "message", {**GOOD, "remember": "yes"}, "remember", InvalidMessage),
    Case(
        "idempotency_key>255",
        "message",
        {**GOOD, "idempotency_key": "k" * 256},
        "idempotency_key",
        InvalidMessage,
    ),
    Case(
        "tool_calls wrong type",
        "message",
        {"role": "assistant", "content": None, "tool_calls": "x"},
        "tool_calls",
        InvalidMessage,
    ),
    Case(
        "tool_call_id>255",
        "message",
        {"role": "tool", "tool_call_id": "c" * 256, "content": "r"},
        "tool_call_id",
        InvalidMessage,
    ),
    Case("not an object", "message", "hello", "message", InvalidMessage),
]

SESSION_CASES = [
    Case("title>255", "session", {"title": "t" * 256}, "title", InvalidSession),
    Case("title NUL", "session", {"title": NUL}, "title", InvalidSession),
    Case("title wrong type", "session", {"title": 5}, "title", InvalidSession),
    Case("key>255", "session", {"key": "k" * 256}, "key", InvalidSession),
    Case("key NUL", "session", {"key": NUL}, "key", InvalidSession),
    Case("key empty", "session", {"key": ""}, "key", InvalidSession),
    Case("namespace>100", "session", {"namespace": "n" * 101}, "namespace", InvalidSession),
    Case("namespace NUL", "session", {"namespace": NUL}, "namespace", InvalidSession),
    Case("metadata 2MB", "session", {"metadata": TWO_MB}, "metadata", InvalidSession),
    Case("metadata list", "session", {"metadata": ["a", "b"]}, "metadata", InvalidSession),
    Case("metadata deep", "session", {"metadata": DEEP}, "metadata", InvalidSession),
    Case("metadata NUL", "session", {"metadata": {"a": NUL}}, "metadata", InvalidSession),
    Case(
        "expires_at wrong type", "session", {"expires_at": "tomorrow"}, "expires_at", InvalidSession
    ),
]
#: Fields a session's owner may change after creation (PATCH, update(), the admin form).
EDITABLE = {"title", "metadata", "expires_at"}

SNAPSHOT_CASES = [
    Case(
        "summary 2,000,000 chars", "snapshot", {"summary": HUGE_SUMMARY}, "summary", InvalidSnapshot
    ),
    Case("summary NUL", "snapshot", {"summary": NUL}, "summary", InvalidSnapshot),
    Case("summary wrong type", "snapshot", {"summary": 5}, "summary", InvalidSnapshot),
    Case("summary empty", "snapshot", {"summary": ""}, "summary", InvalidSnapshot),
    Case(
        "pinned too big",
        "snapshot",
        {"pinned": [{"role": "user", "content": "p" * 200_000}] * 2},
        "pinned",
        InvalidSnapshot,
    ),
    Case(
        "pinned too many",
        "snapshot",
        {"pinned": [{"role": "user", "content": "p"}] * 51},
        "pinned",
        InvalidSnapshot,
    ),
    Case("pinned [1]", "snapshot", {"pinned": [1]}, "pinned[0]", InvalidSnapshot),
    Case(
        "pinned unknown key",
        "snapshot",
        {"pinned": [{**GOOD, "foo": "bar"}]},
        "pinned[0].foo",
        InvalidSnapshot,
    ),
    Case(
        "pinned NUL",
        "snapshot",
        {"pinned": [{"role": "user", "content": NUL}]},
        "pinned[0].content",
        InvalidSnapshot,
    ),
    Case("model>100", "snapshot", {"model": "m" * 1000}, "model", InvalidSnapshot),
    Case("metadata 2MB", "snapshot", {"metadata": TWO_MB}, "metadata", InvalidSnapshot),
    Case("metadata deep", "snapshot", {"metadata": DEEP}, "metadata", InvalidSnapshot),
    Case("metadata list", "snapshot", {"metadata": ["a", "b"]}, "metadata", InvalidSnapshot),
    Case("upto 2**63", "snapshot", {"upto": 2**63}, "upto", InvalidCursor),
    Case("upto -1", "snapshot", {"upto": -1}, "upto", InvalidCursor),
    Case("upto abc", "snapshot", {"upto": "abc"}, "upto", InvalidCursor),
    Case("upto 1.5", "snapshot", {"upto": 1.5}, "upto", InvalidCursor),
    Case("upto beyond the log", "snapshot", {"upto": 99}, "upto", InvalidCursor),
    Case("prev abc", "snapshot", {"prev": "abc"}, "prev", InvalidSnapshot),
]

#: Cursors, counts and budgets: each goes into every read parameter below.
NUMBER_CASES = [
    Case("2**63", "number", 2**63, None),
    Case("-1", "number", -1, None),
    Case("abc", "number", "abc", None),
    Case("1.5", "number", 1.5, None),
]


def _set(path: str, value: Any) -> Callable[[dict], dict]:
    """An export edit: ``messages.0.foo`` = value."""

    def edit(export: dict) -> dict:
        export = copy.deepcopy(export)
        *parents, last = path.split(".")
        target = export
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
        return export

    return edit


IMPORT_CASES = [
    Case("top level foo", "import", _set("foo", "bar"), "foo", InvalidExport),
    Case("session foo", "import", _set("session.foo", "bar"), "session.foo", InvalidExport),
    Case("message foo", "import", _set("messages.0.foo", "bar"), "messages[0].foo", InvalidExport),
    Case(
        "message embedding",
        "import",
        _set("messages.0.embedding", [0.1, 0.2]),
        "messages[0].embedding",
        InvalidExport,
    ),
    Case(
        "snapshot foo", "import", _set("snapshots.0.foo", "bar"), "snapshots[0].foo", InvalidExport
    ),
    Case(
        "message content>256KiB",
        "import",
        _set("messages.0.content", BIG_CONTENT),
        "messages[0].content",
        InvalidExport,
    ),
    Case(
        "message content NUL",
        "import",
        _set("messages.0.content", NUL),
        "messages[0].content",
        InvalidExport,
    ),
    Case(
        "message metadata 2MB",
        "import",
        _set("messages.0.metadata", TWO_MB),
        "messages[0].metadata",
        InvalidExport,
    ),
    Case(
        "message metadata deep",
        "import",
        _set("messages.0.metadata", DEEP),
        "messages[0].metadata",
        InvalidExport,
    ),
    Case(
        "message cursor -1",
        "import",
        _set("messages.0.cursor", -1),
        "messages[0].cursor",
        InvalidExport,
    ),
    Case(
        "message cursor 2**63",
        "import",
        _set("messages.0.cursor", 2**63),
        "messages[0].cursor",
        InvalidExport,
    ),
    Case(
        "message cursor abc",
        "import",
        _set("messages.0.cursor", "abc"),
        "messages[0].cursor",
        InvalidExport,
    ),
    Case(
        "message cursor 1.5",
        "import",
        _set("messages.0.cursor", 1.5),
        "messages[0].cursor",
        InvalidExport,
    ),
    Case("messages wrong type", "import", _set("messages", "x"), "messages", InvalidExport),
    Case(
        "session title>255",
        "import",
        _set("session.title", "t" * 256),
        "session.title",
        InvalidExport,
    ),
    Case("session key>255", "import", _set("session.key", "k" * 256), "session.key", InvalidExport),
    Case(
        "session namespace>100",
        "import",
        _set("session.namespace", "n" * 101),
        "session.namespace",
        InvalidExport,
    ),
    Case(
        "session metadata 2MB",
        "import",
        _set("session.metadata", TWO_MB),
        "session.metadata",
        InvalidExport,
    ),
    Case(
        "session metadata list",
        "import",
        _set("session.metadata", ["a", "b"]),
        "session.metadata",
        InvalidExport,
    ),
    Case(
        "session metadata deep",
        "import",
        _set("session.metadata", DEEP),
        "session.metadata",
        InvalidExport,
    ),
    Case(
        "session next_seq 2**63",
        "import",
        _set("session.next_seq", 2**63),
        "session.next_seq",
        InvalidExport,
    ),
    Case(
        "snapshot summary 2,000,000 chars",
        "import",
        _set("snapshots.0.summary", HUGE_SUMMARY),
        "snapshots[0].summary",
        InvalidExport,
    ),
    Case(
        "snapshot pinned [1]",
        "import",
        _set("snapshots.0.pinned", [1]),
        "snapshots[0].pinned",
        InvalidExport,
    ),
    Case(
        "snapshot metadata deep",
        "import",
        _set("snapshots.0.metadata", DEEP),
        "snapshots[0].metadata",
        InvalidExport,
    ),
    Case(
        "snapshot upto -1",
        "import",
        _set("snapshots.0.upto", -1),
        "snapshots[0].upto",
        InvalidExport,
    ),
]

#: The hostile table: every entry point below draws its cases from it.
HOSTILE = MESSAGE_CASES + SESSION_CASES + SNAPSHOT_CASES + NUMBER_CASES + IMPORT_CASES


def of_kind(kind: str, where: Callable[[Case], bool] = lambda c: True) -> list[Case]:
    return [c for c in HOSTILE if c.kind == kind and where(c)]


def grid(entries: list[str], cases: list[Case]) -> list:
    """``(entry, case)`` pairs with ids ``entry: case``."""
    return [pytest.param(e, c, id=f"{e}: {c.id}") for e in entries for c in cases]


# ---- the world: two owners, each with a session holding every kind of row ----------------------
@dataclass
class World:
    alice: Any
    bob: Any
    mine: SessionMemory  # alice's session
    theirs: SessionMemory  # bob's session
    api: Any  # alice's API client
    bob_api: Any

    def state(self) -> tuple:
        """Everything a refused input must leave as it was."""
        counts = (
            Session.objects.count(),
            Message.objects.count(),
            Snapshot.objects.count(),
            Embedding.objects.count(),
        )
        # The stored counters too: windows and summaries read them, exports do not carry them.
        counters = list(
            Session.objects.order_by("pk").values_list(
                "pk", "message_count", "token_count", "tokens_since_snapshot", "next_seq"
            )
        )
        exports = [SessionMemory(s).export() for s in Session.objects.order_by("pk")]
        return counts, json.dumps([counters, exports], sort_keys=True, default=str)


@pytest.fixture
def world(user, other_user) -> World:
    mine = fill_owner(user, sessions=1)[0]
    theirs = fill_owner(other_user, sessions=1, prefix="bob")[0]
    return World(
        alice=user,
        bob=other_user,
        mine=mine,
        theirs=theirs,
        api=api_client_for(user),
        bob_api=api_client_for(other_user),
    )


def where_(entry: str, case: Case) -> str:
    shown = case.value if not callable(case.value) else case.id
    text = repr(shown)
    return f"{entry} with {case.id} ({text[:80]}{'...' if len(text) > 80 else ''})"


def field_matches(actual: str | None, expected: str | None) -> bool:
    if expected is None:
        return True
    if actual is None:
        return False
    return actual == expected or (actual.startswith(expected) and actual[len(expected)] in ".[")


def assert_typed(
    entry: str,
    case: Case,
    call: Callable[[], Any],
    error: type | None = None,
    field: str | None = ...,
) -> None:  # type: ignore[assignment]
    """``call()`` raises a typed error of the catalogue naming the field at fault."""
    error = error or case.error
    expected_field = case.field if field is ... else field
    try:
        result = call()
    except MemoryStoreError as err:
        got = getattr(err, "field", None)
        assert isinstance(err, error), (
            f"{where_(entry, case)}: expected {error.__name__}, got {type(err).__name__}: {err}"
        )
        assert field_matches(got, expected_field), (
            f"{where_(entry, case)}: {type(err).__name__} names field {got!r}, "
            f"expected {expected_field!r}: {err}"
        )
        return
    except Exception as err:  # an untyped error is a finding, reported as one
        pytest.fail(f"{where_(entry, case)}: untyped {type(err).__name__}: {str(err)[:200]}")
    pytest.fail(f"{where_(entry, case)}: accepted (returned {str(result)[:120]})")


def assert_4xx(
    entry: str,
    case: Case,
    response,
    field: str | None = ...,
    status: int | None = None,
    code: str | None = None,
) -> dict:  # type: ignore[assignment]
    """A JSON error body with ``code`` (and ``field`` naming the field at fault), never a 5xx."""
    expected_field = case.field if field is ... else field
    body_text = response.content[:300]
    assert 400 <= response.status_code < 500, (
        f"{where_(entry, case)}: answered {response.status_code}: {body_text!r}"
    )
    if status is not None:
        assert response.status_code == status, (
            f"{where_(entry, case)}: answered {response.status_code}, expected {status}: "
            f"{body_text!r}"
        )
    content_type = response.get("Content-Type", "")
    assert content_type.startswith("application/json"), (
        f"{where_(entry, case)}: {response.status_code} is {content_type or 'no content type'}, "
        f"not JSON: {body_text!r}"
    )
    body = response.json()
    assert body.get("code") and body.get("detail"), f"{where_(entry, case)}: no code/detail: {body}"
    if code is not None:
        assert body["code"] == code, (
            f"{where_(entry, case)}: code {body['code']!r}, expected {code!r}"
        )
    assert field_matches(body.get("field"), expected_field), (
        f"{where_(entry, case)}: field {body.get('field')!r}, expected {expected_field!r}: "
        f"{body.get('detail')!r}"
    )
    return body


def assert_unchanged_and_readable(world: World, before: tuple, entry: str, case: Case) -> None:
    after = world.state()
    assert after[0] == before[0], (
        f"{where_(entry, case)}: row counts changed {before[0]} -> {after[0]}"
    )
    assert after[1] == before[1], f"{where_(entry, case)}: a session's export changed"
    assert_readable(world, f"{where_(entry, case)}, afterwards")


def assert_readable(world: World, what: str) -> None:
    for session in Session.objects.all():
        memory = SessionMemory(session)
        for name, read, kwargs in [
            ("window()", memory.window, {}),
            ("window(max_tokens=1000)", memory.window, {"max_tokens": 1000}),
            ("context('x', max_tokens=500)", memory.context, {"query": "x", "max_tokens": 500}),
            ("export()", memory.export, {}),
        ]:
            try:
                read(**kwargs)
            except Exception as err:
                pytest.fail(
                    f"{what}: {session.key}.{name} fails: {type(err).__name__}: {str(err)[:200]}"
                )
        client = world.api if session.owner_id == world.alice.pk else world.bob_api
        for route, query in (("window", ""), ("context", "?q=x&max_tokens=500")):
            response = client.get(session_url(session.pk, route) + query)
            assert response.status_code == 200, (
                f"{what}: API {route}/ of {session.key} is {response.status_code}: "
                f"{response.content[:200]!r}"
            )


# ---- the adapter ---------------------------------------------------------------------------------
MESSAGE_ENTRIES = ["adapter.add", "adapter.add_many", "adapter.Memory.import_session"]


@pytest.mark.parametrize(("entry", "case"), grid(MESSAGE_ENTRIES, of_kind("message")))
def test_adapter_refuses_hostile_messages(world, entry, case):
    before = world.state()
    mem = world.mine
    if entry == "adapter.add":
        assert_typed(entry, case, lambda: mem.add(copy.deepcopy(case.value)))
    elif entry == "adapter.add_many":

        def add_many():
            return mem.add_many([dict(GOOD), copy.deepcopy(case.value)])

        assert_typed(entry, case, add_many)
        try:
            add_many()
        except InvalidMessage as err:
            assert err.index == 1, f"{where_(entry, case)}: index {err.index}, expected 1"
        except MemoryStoreError:
            pass
    else:
        export = mem.export()
        hostile = copy.deepcopy(case.value)
        if isinstance(hostile, dict):
            hostile.update(cursor=export["session"]["next_seq"])
        export["messages"].append(hostile)
        export["session"]["next_seq"] += 1
        n = len(export["messages"]) - 1
        assert_typed(
            entry,
            case,
            lambda: Memory.import_session(export, key="copy"),
            InvalidExport,
            f"messages[{n}]" if case.field == "message" else f"messages[{n}].{case.field}",
        )
    assert_unchanged_and_readable(world, before, entry, case)


SESSION_ENTRIES = [
    "adapter.Memory.create",
    "adapter.Memory.session",
    "adapter.update",
    "adapter.set_title",
    "adapter.set_meta",
]


def _session_entry_applies(entry: str, case: Case) -> bool:
    (name,) = case.value
    if entry in ("adapter.update",):
        return name in EDITABLE
    if entry == "adapter.set_title":
        return name == "title"
    if entry == "adapter.set_meta":
        return name == "metadata" and isinstance(case.value["metadata"], dict)
    return True


@pytest.mark.parametrize(
    ("entry", "case"),
    [p for p in grid(SESSION_ENTRIES, of_kind("session")) if _session_entry_applies(*p.values)],
)
def test_adapter_refuses_hostile_session_fields(world, entry, case):
    before = world.state()
    mem, value = world.mine, copy.deepcopy(case.value)
    calls = {
        "adapter.Memory.create": lambda: Memory.create(
            **{"key": "new", "owner": world.alice, **value}
        ),
        "adapter.Memory.session": lambda: Memory.session(
            value.pop("key", "new"), owner=world.alice, **value
        ),
        "adapter.update": lambda: mem.update(**value),
        "adapter.set_title": lambda: mem.set_title(value["title"]),
        "adapter.set_meta": lambda: [mem.set_meta(k, v) for k, v in value["metadata"].items()],
    }
    assert_typed(entry, case, calls[entry])
    assert_unchanged_and_readable(world, before, entry, case)


def _snapshot_kwargs(case: Case) -> dict:
    kwargs = {"summary": "A good summary.", "upto": 4, "prev": 1}
    kwargs.update(copy.deepcopy(case.value))
    return kwargs


@pytest.mark.parametrize(("entry", "case"), grid(["adapter.save_snapshot"], of_kind("snapshot")))
def test_adapter_refuses_hostile_snapshots(world, entry, case):
    before = world.state()
    kwargs = _snapshot_kwargs(case)
    assert_typed(entry, case, lambda: world.mine.save_snapshot(kwargs.pop("summary"), **kwargs))
    assert_unchanged_and_readable(world, before, entry, case)


#: Every read parameter that takes a cursor, count or budget: (entry, call, field, error).
NUMBER_ENTRIES: dict[str, tuple[Callable[[SessionMemory, Any], Any], str, type]] = {
    "adapter.messages(after=)": (lambda m, v: m.messages(after=v), "after", InvalidCursor),
    "adapter.messages(before=)": (
        lambda m, v: m.messages(before=v, limit=5),
        "before",
        InvalidCursor,
    ),
    "adapter.messages(limit=)": (lambda m, v: m.messages(limit=v), "limit", InvalidCursor),
    "adapter.last(n)": (lambda m, v: m.last(v), "n", InvalidCursor),
    "adapter.get_message(cursor)": (lambda m, v: m.get_message(v), "cursor", InvalidCursor),
    "adapter.window(max_tokens=)": (
        lambda m, v: m.window(max_tokens=v),
        "max_tokens",
        InvalidCursor,
    ),
    "adapter.window(max_messages=)": (
        lambda m, v: m.window(max_messages=v),
        "max_messages",
        InvalidCursor,
    ),
    "adapter.context(max_tokens=)": (
        lambda m, v: m.context("x", max_tokens=v),
        "max_tokens",
        InvalidCursor,
    ),
    "adapter.context(recall_k=)": (
        lambda m, v: m.context("x", recall_k=v),
        "recall_k",
        InvalidSearch,
    ),
    "adapter.search(limit=)": (lambda m, v: m.search("x", limit=v), "limit", InvalidSearch),
}


@pytest.mark.parametrize(("entry", "case"), grid(list(NUMBER_ENTRIES), of_kind("number")))
def test_adapter_refuses_hostile_cursors_and_budgets(world, entry, case):
    before = world.state()
    call, name, error = NUMBER_ENTRIES[entry]
    assert_typed(entry, case, lambda: call(world.mine, case.value), error, name)
    assert_unchanged_and_readable(world, before, entry, case)


SEARCH_CASES = [
    Case("query NUL", "search", {"query": NUL}, "query", InvalidSearch),
    Case("query wrong type", "search", {"query": 5}, "query", InvalidSearch),
    Case("query 2,000,000 chars", "search", {"query": HUGE_SUMMARY}, "query", InvalidSearch),
    Case("scope unknown", "search", {"scope": "everyone"}, "scope", InvalidSearch),
    Case("mode unknown", "search", {"mode": "magic"}, "mode", InvalidSearch),
    Case("roles wrong type", "search", {"roles": "user"}, "roles", InvalidSearch),
]
HOSTILE += SEARCH_CASES


@pytest.mark.parametrize(
    ("entry", "case"), grid(["adapter.search", "adapter.context"], SEARCH_CASES)
)
def test_adapter_refuses_hostile_searches(world, entry, case):
    before = world.state()
    kwargs = {"query": "weather", **case.value}
    query = kwargs.pop("query")
    if entry == "adapter.search":
        assert_typed(entry, case, lambda: world.mine.search(query, **kwargs))
    else:
        assert_typed(entry, case, lambda: world.mine.context(query, max_tokens=500, **kwargs))
    assert_unchanged_and_readable(world, before, entry, case)


@pytest.mark.parametrize(
    ("entry", "case"), grid(["adapter.Memory.import_session"], of_kind("import"))
)
def test_adapter_import_refuses_hostile_exports(world, entry, case):
    before = world.state()
    data = case.value(world.mine.export())
    assert_typed(
        entry, case, lambda: Memory.import_session(data, key=None if "key" in case.id else "copy")
    )
    assert_unchanged_and_readable(world, before, entry, case)


FOREIGN = Case("another owner's session id", "owner", None, None, SessionNotFound)


def test_adapter_does_not_open_another_owners_session(world):
    before = world.state()
    entry = "adapter.Memory.get(bob's id, owner=alice)"
    assert_typed(entry, FOREIGN, lambda: Memory.get(world.theirs.id, owner=world.alice))
    assert_typed(
        "adapter.Memory.get(not-a-uuid)",
        FOREIGN,
        lambda: Memory.get("not-a-uuid", owner=world.alice),
    )
    assert_unchanged_and_readable(world, before, entry, FOREIGN)


def test_adapter_import_keeps_the_exports_owner(world):
    case = Case("re-import of an export under its taken key", "import", None, None, SessionExists)
    before = world.state()
    export = world.mine.export()
    assert export["session"].get("owner") == world.alice.pk, "export() does not name the owner"
    assert_typed(
        "adapter.Memory.import_session(mem.export())", case, lambda: Memory.import_session(export)
    )
    assert_unchanged_and_readable(world, before, "adapter.Memory.import_session", case)
    copied = Memory.import_session(export, key="copy")
    assert copied.owner_id == world.alice.pk, "import dropped the export's owner"


IDEMPOTENCY = Case(
    "idempotency key reused with other content",
    "message",
    {"role": "user", "content": "Something else entirely", "idempotency_key": "q-0"},
    "idempotency_key",
    IdempotencyConflict,
)


@pytest.mark.parametrize("entry", ["adapter.add", "adapter.add_many"])
def test_adapter_refuses_a_reused_idempotency_key_with_other_content(world, entry):
    before = world.state()
    original = world.mine.messages()[1]
    same = {
        "role": "user",
        "content": original.content,
        "metadata": original.metadata,
        "idempotency_key": "q-0",
    }
    assert world.mine.add(same).cursor == original.cursor  # a true retry: the original row
    if entry == "adapter.add":
        assert_typed(entry, IDEMPOTENCY, lambda: world.mine.add(dict(IDEMPOTENCY.value)))
    else:
        assert_typed(
            entry, IDEMPOTENCY, lambda: world.mine.add_many([dict(GOOD), dict(IDEMPOTENCY.value)])
        )
    assert_unchanged_and_readable(world, before, entry, IDEMPOTENCY)


# ---- the REST API --------------------------------------------------------------------------------
def api_send(client, method: str, url: str, body: Any):
    if method == "get":
        return client.get(url)
    return getattr(client, method)(url, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(
    ("entry", "case"),
    grid(
        ["api.messages.post", "api.messages.post batch", "api.sessions.import"], of_kind("message")
    ),
)
def test_api_refuses_hostile_messages(world, entry, case):
    before = world.state()
    url = session_url(world.mine.id, "messages")
    if entry == "api.messages.post":
        response = api_send(world.api, "post", url, case.value)
        assert_4xx(entry, case, response)
    elif entry == "api.messages.post batch":
        response = api_send(world.api, "post", url, {"messages": [GOOD, case.value]})
        body = assert_4xx(entry, case, response)
        assert body.get("index") == 1, (
            f"{where_(entry, case)}: index {body.get('index')!r}, expected 1"
        )
    else:
        export = world.mine.export()
        hostile = copy.deepcopy(case.value)
        if isinstance(hostile, dict):
            hostile.update(cursor=export["session"]["next_seq"])
        export["messages"].append(hostile)
        export["session"]["next_seq"] += 1
        n = len(export["messages"]) - 1
        response = api_send(world.api, "post", import_url() + "?key=copy", export)
        assert_4xx(
            entry,
            case,
            response,
            f"messages[{n}]" if case.field == "message" else f"messages[{n}].{case.field}",
        )
    assert_unchanged_and_readable(world, before, entry, case)


@pytest.mark.parametrize(
    ("entry", "case"),
    [
        *grid(["api.sessions.create"], of_kind("session")),
        *grid(["api.sessions.patch"], of_kind("session", lambda c: set(c.value) <= EDITABLE)),
    ],
)
def test_api_refuses_hostile_session_fields(world, entry, case):
    before = world.state()
    if entry == "api.sessions.create":
        response = api_send(world.api, "post", sessions_url(), {"key": "new", **case.value})
    else:
        response = api_send(world.api, "patch", session_url(world.mine.id), case.value)
    assert_4xx(entry, case, response)
    assert_unchanged_and_readable(world, before, entry, case)


@pytest.mark.parametrize(("entry", "case"), grid(["api.snapshot.post"], of_kind("snapshot")))
def test_api_refuses_hostile_snapshots(world, entry, case):
    before = world.state()
    kwargs = _snapshot_kwargs(case)
    kwargs["prev_version"] = kwargs.pop("prev")
    field_name = "prev_version" if case.field == "prev" else case.field
    response = api_send(world.api, "post", session_url(world.mine.id, "snapshot"), kwargs)
    assert_4xx(entry, case, response, field_name)
    assert_unchanged_and_readable(world, before, entry, case)


#: Every query parameter of the API that takes a cursor, count or budget.
API_NUMBER_PARAMS = [
    ("messages", "after"),
    ("messages", "limit"),
    ("window", "max_tokens"),
    ("window", "max_messages"),
    ("context", "max_tokens"),
    ("context", "recall_k"),
    ("search", "limit"),
]


def _query_text(value: Any) -> str:
    return str(value)


@pytest.mark.parametrize(
    ("entry", "case"), grid([f"api.{r}/?{p}=" for r, p in API_NUMBER_PARAMS], of_kind("number"))
)
def test_api_refuses_hostile_cursors_and_budgets(world, entry, case):
    before = world.state()
    route, param = entry[len("api.") :].split("/?")
    param = param.rstrip("=")
    query = {"q": "weather"} if route in ("search", "context") else {}
    query[param] = _query_text(case.value)
    response = world.api.get(session_url(world.mine.id, route), query)
    assert_4xx(entry, case, response, param, status=400)
    assert_unchanged_and_readable(world, before, entry, case)


API_SEARCH_CASES = [
    Case("q NUL", "search", {"q": NUL}, "q"),
    Case("q>4000 chars", "search", {"q": "q" * 4001}, "q"),
    Case("scope unknown", "search", {"scope": "everyone"}, "scope"),
    Case("mode unknown", "search", {"mode": "magic"}, "mode"),
    Case("roles unknown", "search", {"roles": "wizard"}, "roles"),
    Case("model>200", "search", {"model": "m" * 300}, "model"),
]


@pytest.mark.parametrize(
    ("entry", "case"),
    [
        *grid(["api.search/"], API_SEARCH_CASES[:5]),
        *grid(["api.context/"], API_SEARCH_CASES),
        *grid(["api.window/"], API_SEARCH_CASES[5:]),
    ],
)
def test_api_refuses_hostile_search_parameters(world, entry, case):
    before = world.state()
    route = entry[len("api.") :].rstrip("/")
    query = {"q": "weather", **case.value} if route != "window" else dict(case.value)
    response = world.api.get(session_url(world.mine.id, route), query)
    assert_4xx(entry, case, response, status=400)
    assert_unchanged_and_readable(world, before, entry, case)


@pytest.mark.parametrize(("entry", "case"), grid(["api.sessions.import"], of_kind("import")))
def test_api_import_refuses_hostile_exports(world, entry, case):
    before = world.state()
    data = case.value(world.mine.export())
    query = "" if "key" in case.id else "?key=copy"
    response = api_send(world.api, "post", import_url() + query, data)
    assert_4xx(entry, case, response)
    assert_unchanged_and_readable(world, before, entry, case)


API_BODY_CASES = [
    # (route, method, body, field): unknown keys and wrong types in every body the API reads.
    ("sessions.create", "post", {"key": "new", "foo": "bar"}, "foo"),
    ("sessions.create", "post", {"key": "new", "get_or_create": "yes"}, "get_or_create"),
    ("sessions.patch", "patch", {"foo": "bar"}, "foo"),
    ("sessions.patch", "patch", {"key": "renamed"}, "key"),
    ("sessions.patch", "patch", {"message_count": 0}, "message_count"),
    ("messages.post batch", "post", {"messages": [GOOD], "foo": "bar"}, "foo"),
    ("messages.post batch", "post", {"messages": "x"}, "messages"),
    ("messages.post batch", "post", {"messages": []}, "messages"),
    ("snapshot.post", "post", {"summary": "s", "upto": 4, "prev_version": 1, "foo": "bar"}, "foo"),
    (
        "snapshot.post",
        "post",
        {"summary": "s", "upto": 4, "prev_version": 1, "prune": "yes"},
        "prune",
    ),
    ("summarize", "post", {"foo": "bar"}, "foo"),
    ("summarize", "post", {"keep_recent": -1}, "keep_recent"),
    ("summarize", "post", {"keep_recent": 2**63}, "keep_recent"),
    ("summarize", "post", {"keep_recent": "abc"}, "keep_recent"),
    ("summarize", "post", {"keep_recent": 1.5}, "keep_recent"),
    ("owner.erase", "post", {"confirm": "erase", "foo": "bar"}, "foo"),
    ("owner.erase", "post", {"confirm": "yes"}, "confirm"),
]


def _body_url(world: World, route: str) -> str:
    return {
        "sessions.create": sessions_url(),
        "sessions.patch": session_url(world.mine.id),
        "messages.post batch": session_url(world.mine.id, "messages"),
        "snapshot.post": session_url(world.mine.id, "snapshot"),
        "summarize": session_url(world.mine.id, "summarize"),
        "owner.erase": reverse("memory_api:owner-erase"),
    }[route]


@pytest.mark.parametrize(
    ("route", "method", "body", "field_name"),
    [pytest.param(*row, id=f"api.{row[0]}: {json.dumps(row[2])[:60]}") for row in API_BODY_CASES],
)
def test_api_refuses_unknown_keys_and_wrong_types_in_bodies(world, route, method, body, field_name):
    case = Case(json.dumps(body)[:60], "body", body, field_name)
    entry = f"api.{route}"
    before = world.state()
    assert_4xx(entry, case, api_send(world.api, method, _body_url(world, route), body), status=400)
    assert_unchanged_and_readable(world, before, entry, case)


def test_api_refuses_a_reused_idempotency_key_with_other_content(world):
    entry = "api.messages.post"
    before = world.state()
    response = api_send(
        world.api, "post", session_url(world.mine.id, "messages"), IDEMPOTENCY.value
    )
    assert_4xx(entry, IDEMPOTENCY, response, status=422, code="idempotency_conflict")
    response = api_send(
        world.api,
        "post",
        session_url(world.mine.id, "messages"),
        {"messages": [GOOD, IDEMPOTENCY.value]},
    )
    assert_4xx(entry + " batch", IDEMPOTENCY, response, status=422, code="idempotency_conflict")
    assert_unchanged_and_readable(world, before, entry, IDEMPOTENCY)


#: Every route with a session id, asked by alice about bob's session: 404, nothing changed.
FOREIGN_ROUTES = [
    ("get", None, None),
    ("patch", None, {"title": "mine now"}),
    ("delete", None, None),
    ("get", "messages", None),
    ("post", "messages", GOOD),
    ("get", "window", None),
    ("get", "context", None),
    ("get", "search", None),
    ("get", "snapshot", None),
    ("post", "snapshot", {"summary": "s", "upto": 4, "prev_version": 1}),
    ("post", "summarize", {}),
    ("get", "export", None),
    ("post", "clear", {}),
]


@pytest.mark.parametrize(
    ("method", "route", "body"),
    [pytest.param(*r, id=f"api.{r[1] or 'session'}.{r[0]}") for r in FOREIGN_ROUTES],
)
def test_api_answers_404_for_another_owners_session(world, method, route, body):
    entry = f"api {method.upper()} sessions/{{bob's id}}/{route + '/' if route else ''}"
    before = world.state()
    query = "?q=weather" if route in ("search", "context") else ""
    url = session_url(world.theirs.id, route) + query
    if body is None:
        response = getattr(world.api, method)(url)
    else:
        response = api_send(world.api, method, url, body)
    assert_4xx(entry, FOREIGN, response, None, status=404, code="not_found")
    # The same for an id that is not a UUID at all.
    url = session_url("not-a-uuid", route) + query
    response = (
        getattr(world.api, method)(url) if body is None else api_send(world.api, method, url, body)
    )
    assert_4xx(entry.replace("bob's id", "not-a-uuid"), FOREIGN, response, None, status=404)
    assert_unchanged_and_readable(world, before, entry, FOREIGN)


def test_api_import_of_a_foreign_export_is_the_requesters(world):
    # Bob's export, imported by alice: hers (owner= is the requester), never bob's.
    case = Case("bob's export imported by alice", "owner", None, None)
    response = api_send(world.api, "post", import_url() + "?key=copy", world.theirs.export())
    assert response.status_code == 201, (
        f"api.sessions.import with {case.id}: {response.content[:200]!r}"
    )
    assert Session.objects.get(pk=response.json()["id"]).owner_id == world.alice.pk
    assert_readable(world, "after api.sessions.import of bob's export")


ROUTE_CASES = [
    ("get", API_PREFIX + "nope/", 404),
    ("get", API_PREFIX + "sessions/{id}/nope/", 404),
    ("post", API_PREFIX + "sessions", None),  # no trailing slash
    ("get", API_PREFIX + "sessions/{id}/window", None),
    ("patch", API_PREFIX + "sessions/{id}", None),
    ("post", API_PREFIX + "sessions/import", None),
    ("put", API_PREFIX + "sessions/{id}/", 405),
]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [pytest.param(*r, id=f"api {r[0].upper()} {r[1][len(API_PREFIX) :]}") for r in ROUTE_CASES],
)
def test_api_answers_json_errors_on_unknown_routes_and_missing_slashes(world, method, path, status):
    url = path.format(id=world.mine.id)
    case = Case(f"{method.upper()} {url}", "route", url, None)
    entry = f"api {method.upper()} {path[len(API_PREFIX) :]}"
    before = world.state()
    try:
        response = api_send(world.api, method, url, {"key": "new"})
    except Exception as err:  # e.g. Django's APPEND_SLASH RuntimeError on a POST: a 500
        pytest.fail(f"{entry}: 500 ({type(err).__name__}: {str(err)[:200]})")
    assert_4xx(entry, case, response, None, status=status)
    assert_unchanged_and_readable(world, before, entry, case)


# ---- a provider outage during recall -----------------------------------------------------------
@contextlib.contextmanager
def embedder_down(settings):
    """The embedder is OpenAIEmbedder pointed at a closed port on 127.0.0.1, without retries."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configured = dict(getattr(settings, "MEMORY_APP", None) or {})
    with override_settings(
        MEMORY_APP={
            **configured,
            "EMBEDDER": "memory_app.providers.embeddings.OpenAIEmbedder",
            "EMBEDDER_OPTIONS": {
                "model": "text-embedding-3-small",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "api_key": "test",
                "max_retries": 0,
                "timeout": 5,
            },
        }
    ):
        yield port


OUTAGE = Case("embedding provider outage", "provider", None, None, TransientEmbedderError)


@pytest.mark.parametrize("entry", ["adapter.search", "api.search/"])
def test_a_provider_outage_during_a_search_is_retryable(world, settings, entry):
    before = world.state()
    with embedder_down(settings):
        if entry == "adapter.search":
            assert_typed(entry, OUTAGE, lambda: world.mine.search("weather"))
        else:
            route = entry[len("api.") :].rstrip("/")
            response = world.api.get(session_url(world.mine.id, route), {"q": "weather"})
            assert response.status_code == 503, (
                f"{entry} with {OUTAGE.id}: answered {response.status_code}: "
                f"{response.content[:200]!r}"
            )
            assert response.get("Retry-After"), f"{entry} with {OUTAGE.id}: 503 without Retry-After"
            assert response.json().get("code"), f"{entry} with {OUTAGE.id}: no code"
    assert_unchanged_and_readable(world, before, entry, OUTAGE)


def test_a_provider_outage_during_context_sends_the_plain_window(world, settings):
    """context() is what an agent sends the model next: an embedder outage costs the recalled
    messages, not the turn. The window says why nothing was recalled."""
    before = world.state()
    plain = world.mine.window(max_tokens=500)
    with embedder_down(settings):
        window = world.mine.context("weather", max_tokens=500)
        assert window.messages == plain.messages and window.recalled == ()
        assert "text-embedding-3-small" in window.recall_error
        response = world.api.get(
            session_url(world.mine.id, "context"), {"q": "weather", "max_tokens": 500}
        )
        assert response.status_code == 200, response.content[:200]
        body = response.json()
        assert body["messages"] == plain.messages and body["recall_error"]
    assert_unchanged_and_readable(world, before, "context", OUTAGE)


# ---- the admin -----------------------------------------------------------------------------------
@pytest.fixture
def staff(world, django_user_model) -> Client:
    admin_user = django_user_model.objects.create_superuser("staff", "staff@example.com", "pw")
    client = Client()
    client.force_login(admin_user)
    return client


def change_url(session_id) -> str:
    return reverse("admin:memory_app_session_change", args=[session_id])


def _admin_request(entry: str, case: Case, call: Callable[[], Any]):
    try:
        return call()
    except Exception as err:  # the test client re-raises what the view did not handle: a 500
        pytest.fail(f"{where_(entry, case)}: 500 ({type(err).__name__}: {str(err)[:200]})")


def assert_admin_error_shown(entry: str, case: Case, response) -> None:
    """200 with the error on the page: a form error, an error message, or the transcript's note."""
    assert response.status_code == 200, (
        f"{where_(entry, case)}: answered {response.status_code}"
        + (f" to {response.get('Location')}" if response.status_code in (301, 302) else "")
    )
    context = response.context or {}
    form = context.get("adminform").form if context.get("adminform") else None
    errors = [str(m) for m in get_messages(response.wsgi_request) if m.level >= ERROR]
    shown = (
        bool(form is not None and form.errors) or bool(errors) or bool(context.get("cursor_error"))
    )
    assert shown, f"{where_(entry, case)}: 200 but no error on the page"


def _admin_form_data(session: Session, **changes: str) -> dict:
    expires = session.expires_at
    data = {
        "title": session.title,
        "metadata": json.dumps(session.metadata),
        "expires_at_0": expires.date().isoformat() if expires else "",
        "expires_at_1": expires.time().isoformat() if expires else "",
        "_save": "Save",
    }
    data.update(changes)
    return data


ADMIN_FORM_CASES = [
    Case("title>255", "admin", {"title": "t" * 256}, "title"),
    Case("title NUL", "admin", {"title": NUL}, "title"),
    Case('metadata ["a","b"]', "admin", {"metadata": '["a", "b"]'}, "metadata"),
    Case("metadata 2 MB", "admin", {"metadata": json.dumps(TWO_MB)}, "metadata"),
    Case("metadata deep", "admin", {"metadata": json.dumps(DEEP)}, "metadata"),
    Case("metadata NUL", "admin", {"metadata": json.dumps({"a": NUL})}, "metadata"),
    Case("metadata not JSON", "admin", {"metadata": "{nope"}, "metadata"),
    Case("metadata a string", "admin", {"metadata": '"text"'}, "metadata"),
    Case(
        "expires_at garbage",
        "admin",
        {"expires_at_0": "tomorrow", "expires_at_1": "noon"},
        "expires_at",
    ),
    Case(
        "expires_at year 99999",
        "admin",
        {"expires_at_0": "99999-01-01", "expires_at_1": "00:00"},
        "expires_at",
    ),
]
HOSTILE += ADMIN_FORM_CASES


@pytest.mark.parametrize(("entry", "case"), grid(["admin.session change form"], ADMIN_FORM_CASES))
def test_admin_change_form_shows_an_error_for_hostile_fields(world, staff, entry, case):
    before = world.state()
    session = world.mine.refresh().session
    response = _admin_request(
        entry,
        case,
        lambda: staff.post(change_url(session.pk), _admin_form_data(session, **case.value)),
    )
    assert_admin_error_shown(entry, case, response)
    assert_unchanged_and_readable(world, before, entry, case)


ADMIN_CURSORS = ["9223372036854775808", "-1", "abc", "1.5", "99999999999999999999999999"]


@pytest.mark.parametrize(
    ("entry", "case"),
    [
        pytest.param(
            f"admin.transcript ?{param}=",
            Case(value, "number", value, None),
            id=f"admin.transcript ?{param}={value[:12]}",
        )
        for param in ("after", "at", "before")
        for value in ADMIN_CURSORS
    ],
)
def test_admin_transcript_shows_an_error_for_hostile_cursors(world, staff, entry, case):
    before = world.state()
    param = entry.split("?")[1].rstrip("=")
    response = _admin_request(
        entry, case, lambda: staff.get(change_url(world.mine.id), {param: case.value})
    )
    assert_admin_error_shown(entry, case, response)
    assert_unchanged_and_readable(world, before, entry, case)


ADMIN_ACTION_CASES = [
    # (what, how): hostile requests to the session actions.
    (
        "summarize_now on a not-a-uuid selection",
        "action",
        {"action": "summarize_now", "_selected_action": ["not-a-uuid"]},
    ),
    (
        "clear_sessions on a not-a-uuid selection",
        "action",
        {"action": "clear_sessions", "_selected_action": ["not-a-uuid"]},
    ),
    ("an unknown action", "action", {"action": "drop_tables", "_selected_action": ["{id}"]}),
    ("export of an unknown session", "get", "{unknown}/export/"),
    ("clear of an unknown session", "post", "{unknown}/clear/"),
    ("summarize of a not-a-uuid session", "post", "not-a-uuid/summarize/"),
    ("reembed of an unknown session", "post", "{unknown}/reembed/"),
    ("change page of a not-a-uuid session", "get", "not-a-uuid/change/"),
]


@pytest.mark.parametrize(
    ("what", "how", "request_data"),
    [pytest.param(*r, id=f"admin: {r[0]}") for r in ADMIN_ACTION_CASES],
)
def test_admin_actions_refuse_hostile_requests_without_a_500(world, staff, what, how, request_data):
    case = Case(what, "admin", request_data, None)
    entry = "admin action" if how == "action" else f"admin {how.upper()}"
    before = world.state()
    base = reverse("admin:memory_app_session_changelist")
    unknown = uuid.uuid4()
    if how == "action":
        data = {
            k: [v.format(id=world.mine.id) for v in vs] if isinstance(vs, list) else vs
            for k, vs in request_data.items()
        }
        response = _admin_request(entry, case, lambda: staff.post(base, data))
    else:
        url = base + request_data.format(unknown=unknown)
        response = _admin_request(entry, case, lambda: getattr(staff, how)(url))
    assert response.status_code < 500, f"{where_(entry, case)}: answered {response.status_code}"
    if response.status_code == 200:
        assert_admin_error_shown(entry, case, response)
    assert_unchanged_and_readable(world, before, entry, case)


# ---- the management commands ---------------------------------------------------------------------
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
COMMAND_CASES = [
    ("memory_embed", "--session", "not-a-uuid"),
    ("memory_embed", "--session", UNKNOWN_ID),
    ("memory_embed", "--batch-size", "0"),
    ("memory_embed", "--batch-size", "abc"),
    ("memory_embed", "--limit", "-1"),
    ("memory_summarize", "--session", "not-a-uuid"),
    ("memory_summarize", "--session", UNKNOWN_ID),
    ("memory_summarize", "--over-threshold", "--threshold", "-1"),
    ("memory_summarize", "--over-threshold", "--threshold", "abc"),
    ("memory_summarize", "--all", "--keep-recent", "-1"),
    ("memory_summarize", "--all", "--keep-recent", str(2**63)),
    ("memory_summarize",),
    ("memory_prune", "--idle", "0d"),
    ("memory_prune", "--idle", "abc"),
    ("memory_prune", "--idle", "-5d"),
    ("memory_prune", "--batch-size", "0"),
    ("memory_prune", "--namespace", "n" * 101),
    ("memory_owner", "export", "alice", "--out", "/nonexistent/x.json"),
    ("memory_owner", "export", "nobody", "--out", "-"),
    ("memory_owner", "export", "alice", "--out", "-", "--batch-size", "0"),
    ("memory_owner", "erase", "abc", "--id", "--yes"),
    ("memory_owner", "erase", NUL, "--yes"),
    ("memory_owner", "shred", "alice"),
    ("memory_rotate_keys",),
    ("memory_rotate_keys", "--batch-size", "0"),
    ("memory_demo", "--bogus"),
]


@pytest.mark.parametrize("argv", [pytest.param(a, id=" ".join(a)[:70]) for a in COMMAND_CASES])
def test_commands_refuse_bad_arguments_with_one_line(world, argv):
    command, *args = argv
    case = Case(" ".join(args) or "(no arguments)", "command", args, None)
    entry = command
    before = world.state()
    if connection.vendor == "postgresql":
        # The test's transaction still holds the fixture's deferred trigger events, which a
        # command run in autocommit would not: fire them now (CREATE INDEX refuses to run with
        # events pending).
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    try:
        call_command(command, *args, stdout=io.StringIO(), stderr=io.StringIO())
    except CommandError as err:
        text = str(err).strip()
        assert text and "\n" not in text, (
            f"{where_(entry, case)}: CommandError is not one line: {text!r}"
        )
        assert "Traceback" not in text, f"{where_(entry, case)}: CommandError holds a traceback"
    except Exception as err:
        pytest.fail(
            f"{where_(entry, case)}: raw {type(err).__name__} (a traceback): {str(err)[:200]}"
        )
    else:
        pytest.fail(f"{where_(entry, case)}: reported success")
    assert_unchanged_and_readable(world, before, entry, case)


def test_erase_without_yes_only_reports(world):
    """Without --yes, memory_owner erase says what it would erase: a report, not a failure."""
    before = world.state()
    out = io.StringIO()
    call_command("memory_owner", "erase", "alice", stdout=out, stderr=io.StringIO())
    assert out.getvalue().startswith("Would erase ")
    assert_unchanged_and_readable(world, before, "memory_owner", Case("erase", "command", [], None))


# ---- LangChain and the Agents SDK ----------------------------------------------------------------
def _langchain_cases() -> list:
    from langchain_core.messages import AIMessage, HumanMessage

    return [
        ("content>256KiB", lambda: HumanMessage(content=BIG_CONTENT), "content", MessageTooLarge),
        ("content NUL", lambda: HumanMessage(content=NUL), "content", InvalidMessage),
        ("id NUL", lambda: HumanMessage(content="hi", id=NUL), "metadata", InvalidMessage),
        (
            "additional_kwargs 2MB",
            lambda: HumanMessage(content="hi", additional_kwargs=TWO_MB),
            "metadata",
            InvalidMessage,
        ),
        (
            "additional_kwargs deep",
            lambda: HumanMessage(content="hi", additional_kwargs=DEEP),
            "metadata",
            InvalidMessage,
        ),
        (
            "response_metadata NUL",
            lambda: AIMessage(content="hi", response_metadata={"a": NUL}),
            "metadata",
            InvalidMessage,
        ),
        ("not a message", lambda: {"role": "user", "content": "hi"}, "message", InvalidMessage),
    ]


LANGCHAIN_IDS = [
    "content>256KiB",
    "content NUL",
    "id NUL",
    "additional_kwargs 2MB",
    "additional_kwargs deep",
    "response_metadata NUL",
    "not a message",
]


@pytest.mark.parametrize(
    "case_id", [pytest.param(i, id=f"langchain.add_messages: {i}") for i in LANGCHAIN_IDS]
)
def test_langchain_history_refuses_hostile_messages(world, case_id):
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from memory_app.integrations.langchain import DjangoChatMessageHistory

    case_id, make, field_name, error = next(c for c in _langchain_cases() if c[0] == case_id)
    case = Case(case_id, "langchain", case_id, field_name, error)
    entry = "langchain.DjangoChatMessageHistory.add_messages"
    before = world.state()
    history = DjangoChatMessageHistory(
        world.mine.key, owner=world.alice, namespace=world.mine.namespace
    )
    assert_typed(entry, case, lambda: history.add_messages([HumanMessage(content="ok"), make()]))
    assert_unchanged_and_readable(world, before, entry, case)


AGENTS_CASES = [
    Case(
        "content>256KiB",
        "agents",
        {"role": "user", "content": BIG_CONTENT},
        "content",
        MessageTooLarge,
    ),
    Case("content NUL", "agents", {"role": "user", "content": NUL}, "content", InvalidMessage),
    Case(
        "item 2MB",
        "agents",
        {"role": "user", "content": "hi", "pad": "x" * 2_000_000},
        "metadata",
        InvalidMessage,
    ),
    Case(
        "item deep",
        "agents",
        {"role": "user", "content": "hi", "deep": DEEP},
        "metadata",
        InvalidMessage,
    ),
    Case(
        "item NUL key",
        "agents",
        {"role": "user", "content": "hi", NUL: 1},
        "metadata",
        InvalidMessage,
    ),
    Case(
        "call_id>255",
        "agents",
        {"type": "function_call", "call_id": "c" * 300, "name": "f", "arguments": "{}"},
        "tool_calls",
        InvalidMessage,
    ),
    Case("not a dict", "agents", "hello", "item", InvalidMessage),
]
HOSTILE += AGENTS_CASES


@pytest.mark.parametrize(("entry", "case"), grid(["agents.MemorySession.add_items"], AGENTS_CASES))
def test_agents_session_refuses_hostile_items(world, entry, case):
    pytest.importorskip("agents")
    from memory_app.integrations.agents import MemorySession

    before = world.state()
    session = MemorySession(world.mine)
    items = [{"role": "user", "content": "ok"}, copy.deepcopy(case.value)]
    assert_typed(entry, case, lambda: async_to_sync(session.add_items)(items))
    assert_unchanged_and_readable(world, before, entry, case)


# ---- the table itself ------------------------------------------------------------
def test_every_defect_of_the_issue_is_a_case():
    ids = {(c.kind, c.id) for c in HOSTILE}
    for needed in [
        ("snapshot", "summary 2,000,000 chars"),
        ("import", "message foo"),
        ("import", "message embedding"),
        ("import", "session foo"),
        ("import", "top level foo"),
        ("import", "snapshot foo"),
        ("admin", 'metadata ["a","b"]'),
        ("session", "metadata 2MB"),
        ("message", "metadata 2MB"),
        ("snapshot", "pinned [1]"),
        ("number", "2**63"),
    ]:
        assert needed in ids, f"the hostile table lacks {needed}"
    assert any(c == ("memory_prune", "--idle", "0d") for c in COMMAND_CASES)
    assert any(
        c[:3] == ("memory_owner", "export", "alice") and "/nonexistent/x.json" in c
        for c in COMMAND_CASES
    )
