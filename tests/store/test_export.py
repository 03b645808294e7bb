"""Export and import: a lossless round trip."""

import json

import pytest

from memory_app import Memory
from memory_app.exceptions import InvalidExport, SessionExists
from tests.conftest import tool_turn


def test_round_trip_is_lossless(mem, other_user):
    mem.set_title("Round trip")
    mem.set_meta("lang", "en")
    call, result = tool_turn("c1")
    mem.add_many(
        [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "look"}],
                "name": "ada",
                "metadata": {"x": 1},
            },
            call,
            result,
            {
                "role": "assistant",
                "content": "ok",
                "extra": {"refusal": None},
                "remember": True,
                "idempotency_key": "k-1",
            },
            {"role": "user", "content": "later"},
        ]
    )
    snap = mem.save_snapshot(
        "summary",
        upto=3,
        prev=None,
        pinned=[{"role": "user", "content": "task"}],
        model="m",
        metadata={"by": "test"},
    )
    mem.save_snapshot("summary 2", upto=4, prev=snap, prune=True)
    data = json.loads(json.dumps(mem.export()))  # JSON-serialisable

    copy = Memory.import_session(data, owner=other_user)
    exported = copy.export()
    for volatile in ("id", "updated_at", "owner"):  # imported for another owner
        exported["session"].pop(volatile)
        data["session"].pop(volatile)
    assert exported == data
    assert copy.messages() == [m for m in copy.messages()]
    assert [
        (m.cursor, m.as_openai(), m.metadata, m.remember, m.idempotency_key, m.tokens)
        for m in copy.messages()
    ] == [
        (m.cursor, m.as_openai(), m.metadata, m.remember, m.idempotency_key, m.tokens)
        for m in mem.messages()
    ]
    assert copy.window().messages == mem.window().messages
    assert copy.add({"role": "user", "content": "next"}).cursor == 7
    assert copy.count() == mem.count() + 1


def test_import_refuses_bad_data_and_taken_keys(mem):
    mem.add({"role": "user", "content": "x"})
    data = mem.export()
    with pytest.raises(SessionExists):
        Memory.import_session(data, owner=mem.session.owner)
    for broken in (
        {},
        {**data, "version": 99},
        {**data, "messages": [{"role": "user", "content": "x"}]},
        {**data, "messages": [{"role": "alien", "content": "x", "cursor": 1}]},
        {**data, "snapshots": [{"version": 1, "upto": 50, "summary": "s"}]},
    ):
        with pytest.raises(InvalidExport):
            Memory.import_session(broken, key="other")
    assert Memory.import_session(data, key="other").count() == 1
