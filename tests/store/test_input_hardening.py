"""The adapter refuses what the database cannot store with a typed error, never a database error.

Also covers the small adapter additions the REST API relies on: ``SessionMemory.info()``,
``Memory.sessions_queryset()`` and ``InvalidCursor.field``.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory_app import Memory
from memory_app.exceptions import (
    InvalidCursor,
    InvalidExport,
    InvalidMessage,
    InvalidSession,
    InvalidSnapshot,
)
from memory_app.memory import MAX_CURSOR
from memory_app.models import Session
from memory_app.validation import ENCRYPTED_PREFIX, check_message

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "user", "content": "hi", "name": "a\x00b"}, "name"),
        ({"role": "user", "content": "hi", "metadata": {"k": "v\x00"}}, "metadata"),
        ({"role": "user", "content": "hi", "metadata": {"k\x00": 1}}, "metadata"),
        ({"role": "user", "content": "hi", "metadata": {"k": float("nan")}}, "metadata"),
        ({"role": "user", "content": "bad \ud800 surrogate"}, "content"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x\x00"}}]},
            "content",
        ),
        ({"role": "tool", "content": "ok", "tool_call_id": "c\x00"}, "tool_call_id"),
        ({"role": "user", "content": "hi", "idempotency_key": "k\x00"}, "idempotency_key"),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "\x00"}}
                ],
            },
            "tool_calls",
        ),
    ],
)
def test_unstorable_text_is_refused_with_the_field(mem, message, field):
    with pytest.raises(InvalidMessage) as caught:
        mem.add(message)
    assert caught.value.field == field
    assert mem.count() == 0


def test_unstorable_message_in_a_batch_names_its_index_and_stores_none(mem):
    batch = [{"role": "user", "content": "fine"}, {"role": "user", "content": "x", "name": "\x00"}]
    with pytest.raises(InvalidMessage) as caught:
        mem.add_many(batch)
    assert (caught.value.index, caught.value.field) == (1, "name")
    assert mem.count() == 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"key": "a\x00"}, "key"),
        ({"key": "ok", "namespace": "n\x00"}, "namespace"),
        ({"key": "ok", "title": "t\x00"}, "title"),
        ({"key": "ok", "metadata": {"a": ["\x00"]}}, "metadata"),
    ],
)
def test_unstorable_session_fields_are_refused(user, fields, field):
    with pytest.raises(InvalidSession) as caught:
        Memory.create(owner=user, **fields)
    assert caught.value.field == field
    assert not Session.objects.exists()


def test_unstorable_update_and_meta_are_refused(mem):
    with pytest.raises(InvalidSession):
        mem.update(metadata={"x": "\x00"})
    with pytest.raises(InvalidSession):
        mem.set_meta("k", "v\x00")
    assert mem.meta == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"summary": "s\x00"},
        {"summary": "fine", "model": "m" * 201},
        {"summary": "fine", "model": "m\x00"},
        {"summary": "fine", "metadata": ["not", "a", "dict"]},
        {"summary": "fine", "metadata": {"k": "\x00"}},
    ],
)
def test_unstorable_snapshot_fields_are_refused(mem, kwargs):
    mem.add({"role": "user", "content": "hello"})
    with pytest.raises(InvalidSnapshot):
        mem.save_snapshot(upto=1, **kwargs)
    assert mem.latest_snapshot() is None


def test_invalid_cursor_names_its_argument(mem):
    mem.add({"role": "user", "content": "hello"})
    with pytest.raises(InvalidCursor) as caught:
        mem.messages(after=-1)
    assert caught.value.field == "after"
    with pytest.raises(InvalidCursor) as caught:
        mem.messages(after=MAX_CURSOR + 1)
    assert caught.value.field == "after"
    with pytest.raises(InvalidCursor) as caught:
        mem.save_snapshot("sum", upto=5)
    assert caught.value.field == "upto"
    assert mem.messages(after=MAX_CURSOR) == []


def test_info_and_sessions_queryset(user, other_user):
    first = Memory.create("a", owner=user, namespace="bot", title="First")
    Memory.create("b", owner=user, namespace="other")
    Memory.create("c", owner=other_user, namespace="bot")
    first.add({"role": "user", "content": "hello"})
    first.save_snapshot("said hello", upto=1)

    info = first.info()
    assert (info.key, info.title, info.message_count, info.has_snapshot) == ("a", "First", 1, True)
    assert [s.key for s in Memory.sessions_queryset(user, namespace="bot")] == ["a"]
    assert sorted(s.key for s in Memory.sessions_queryset(user)) == ["a", "b"]
    assert [s.key for s in Memory.sessions(user, namespace="bot")] == ["a"]


@pytest.fixture
def export(mem):
    mem.add_many(
        [
            {"role": "user", "content": "one", "idempotency_key": "k1"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ]
    )
    mem.save_snapshot("first two", upto=2)
    return mem.export()


def _broken(export, change):
    data = copy.deepcopy(export)
    change(data)
    return data


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(session=["not", "an", "object"]),
        lambda d: d.update(messages={"not": "a list"}),
        lambda d: d["session"].update(expires_at="2024-13-45T00:00:00Z"),
        lambda d: d["session"].update(created_at=12),
        lambda d: d["session"].update(created_at="0001-01-01T00:00:00+05:00"),
        lambda d: d["session"].update(next_seq="many"),
        lambda d: d["session"].update(next_seq=2**70),
        lambda d: d["session"].update(title="\x00"),
        lambda d: d["session"].pop("key"),
        lambda d: d["messages"][0].update(created_at="yesterday"),
        lambda d: d["messages"][0].update(tokens=-1),
        lambda d: d["messages"][0].update(cursor=2**64),
        lambda d: d["messages"][1].update(idempotency_key="k1"),
        lambda d: d["messages"][1].update(extra="not an object", refusal="x"),
        lambda d: d["snapshots"].append(dict(d["snapshots"][0])),  # the same version twice
        lambda d: d["snapshots"][0].update(version=0),
        lambda d: d["snapshots"][0].update(version=2**40),
        lambda d: d["snapshots"][0].update(version="1"),
        lambda d: d["snapshots"][0].update(pinned=[{"role": "nobody"}]),
        lambda d: d["snapshots"][0].update(model=["x"]),
        lambda d: d["snapshots"][0].update(metadata="x"),
        lambda d: d["snapshots"].append("not an object"),
    ],
)
def test_import_refuses_malformed_exports_before_writing(user, export, change):
    sessions_before = Session.objects.count()
    with pytest.raises((InvalidExport, InvalidSession)):
        Memory.import_session(_broken(export, change), owner=user, namespace="imported")
    assert Session.objects.count() == sessions_before


def test_import_accepts_naive_datetimes_as_utc(user, export):
    data = _broken(export, lambda d: d["session"].update(created_at="2024-01-02T03:04:05"))
    copy_ = Memory.import_session(data, owner=user, key="copy")
    assert copy_.info().created_at.isoformat() == "2024-01-02T03:04:05+00:00"
    assert [m.cursor for m in copy_.messages()] == [1, 2, 3]


@pytest.mark.parametrize("batch", ["hello", {"role": "user", "content": "x"}, None, 42])
def test_add_many_refuses_what_is_not_a_list(mem, batch):
    with pytest.raises(InvalidMessage) as caught:
        mem.add_many(batch)
    assert (caught.value.field, caught.value.index) == ("messages", None)
    assert mem.count() == 0


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": {}, "content": "hi"}, "role"),
        ({"role": ["user"], "content": "hi"}, "role"),
        ({"role": "user", "content": [{"type": {}}]}, "content"),
        ({"role": "user", "content": [{"type": ["text"], "text": "x"}]}, "content"),
    ],
)
def test_unhashable_roles_and_part_types_are_invalid_messages(mem, message, field):
    with pytest.raises(InvalidMessage) as caught:
        mem.add(message)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("optional", "wrong"),
    [
        ("name", 0),
        ("name", []),
        ("metadata", []),
        ("metadata", ""),
        ("extra", ""),
        ("extra", []),
        ("tool_call_id", 0),
    ],
)
def test_optional_fields_are_null_or_their_type(mem, optional, wrong):
    with pytest.raises(InvalidMessage) as caught:
        mem.add({"role": "user", "content": "hi", optional: wrong})
    assert caught.value.field == optional
    stored = mem.add({"role": "user", "content": "hi", optional: None})  # null means absent
    assert stored.as_openai() == {"role": "user", "content": "hi"}


@given(
    role=st.sampled_from(["system", "user", "assistant", "tool", "bogus"]),
    text=st.one_of(
        st.text(max_size=50),
        st.sampled_from(["", "a\x00b", "\ud800 lone", "x" * 70_000]),
        st.text(max_size=20).map(lambda t: ENCRYPTED_PREFIX + t),
    ),
)
def test_the_plain_message_short_cut_agrees_with_the_rule_book(role, text):
    # {"role", "content"} takes a short cut; with one more (empty) field the full rule book
    # runs. Both must accept the same messages, as the same stored value, and refuse the rest.
    def outcome(message):
        try:
            return check_message(message)
        except InvalidMessage as err:
            return type(err)

    assert outcome({"role": role, "content": text}) == outcome(
        {"role": role, "content": text, "name": ""}
    )
