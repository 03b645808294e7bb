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


def test_an_import_gets_its_namespace_ttl_and_announces_its_messages(mem, settings):
    """Import creates its session through the store, as every entry point does: the namespace's
    retention gives an expiry the export does not have, and the messages are announced with the
    same signal as an append (what indexes them for recall follows from it)."""
    import datetime as dt

    from django.utils import timezone

    from memory_app.signals import messages_appended

    mem.add_many([{"role": "user", "content": f"note {i}"} for i in range(3)])
    data = mem.export()
    assert data["session"]["expires_at"] is None
    settings.MEMORY_APP = {"RETENTION": {"imports": {"ttl": "14d"}}}
    heard = []

    def receiver(sender, session_id, messages, tokens_since_snapshot, **kwargs):
        heard.append((session_id, [m.cursor for m in messages], tokens_since_snapshot))

    messages_appended.connect(receiver)
    try:
        before = timezone.now()
        copy = Memory.import_session(data, namespace="imports", key="copy")
    finally:
        messages_appended.disconnect(receiver)
    expires = copy.session.expires_at
    assert before + dt.timedelta(days=14) <= expires <= timezone.now() + dt.timedelta(days=14)
    assert heard == [(copy.id, [1, 2, 3], sum(m.tokens for m in copy.messages()))]
    # An expiry the export has is kept.
    mem.update(expires_at=timezone.now() + dt.timedelta(days=2))
    kept = Memory.import_session(mem.export(), namespace="imports", key="kept")
    assert kept.session.expires_at == mem.refresh().session.expires_at
