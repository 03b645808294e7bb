"""The log's hot paths (append, last N, window) against what the ORM stores and reads.

On PostgreSQL these paths use their own SQL; the same tests run on SQLite, where the ORM does
the work, so both give the same answers.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection
from django.test.utils import override_settings

from memory_app import Memory
from memory_app.exceptions import SessionNotFound
from memory_app.models import Message, Session
from tests.conftest import tool_turn

MIXED = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Größe? 東京 🙂", "name": "alice", "metadata": {"lang": "de"}},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
        ],
    },
    *tool_turn("call_a"),
    {"role": "assistant", "content": "Sunny.", "extra": {"refusal": None}, "remember": True},
]


def stored_fields(m):
    return (
        m.cursor,
        m.role,
        m.content,
        m.content_parts,
        m.name,
        m.tool_calls,
        m.tool_call_id,
        m.extra,
        m.metadata,
        m.tokens,
        m.remember,
        m.idempotency_key,
        m.id,
        m.created_at,
    )


def test_append_returns_exactly_what_is_stored(mem):
    returned = mem.add_many(MIXED) + [mem.add({"role": "user", "content": "one more"})]
    assert [m.cursor for m in returned] == list(range(1, len(MIXED) + 2))
    read = mem.messages()
    assert [stored_fields(m) for m in read] == [stored_fields(m) for m in returned]
    assert all(m.created_at is not None for m in returned)
    assert read[0].as_openai() == MIXED[0]
    assert read[1].as_openai() == {"role": "user", "content": "Größe? 東京 🙂", "name": "alice"}
    assert read[2].as_openai() == MIXED[2]
    assert [read[3].as_openai(), read[4].as_openai()] == tool_turn("call_a")
    session = Session.objects.get(pk=mem.id)
    assert (session.next_seq, session.message_count) == (len(MIXED) + 2, len(MIXED) + 1)
    assert session.token_count == sum(m.tokens for m in read) == session.tokens_since_snapshot


def test_last_is_the_tail_in_log_order(mem):
    mem.add_many([{"role": "user", "content": f"m{i}"} for i in range(30)])
    assert [m.cursor for m in mem.last(5)] == [26, 27, 28, 29, 30]
    assert [stored_fields(m) for m in mem.last(30)] == [stored_fields(m) for m in mem.messages()]
    assert mem.last(0) == []
    assert len(mem.last(100)) == 30


def test_append_to_a_deleted_session_fails_and_stores_nothing(mem):
    Session.objects.filter(pk=mem.id).delete()
    with pytest.raises(SessionNotFound):
        mem.add({"role": "user", "content": "hi"})
    with pytest.raises(SessionNotFound):
        mem.add_many([{"role": "user", "content": "hi"}] * 3)
    assert not Message.objects.filter(session_id=mem.id).exists()


def test_idempotent_append_returns_the_original(mem):
    first = mem.add({"role": "user", "content": "pay", "idempotency_key": "k1"})
    again = mem.add({"role": "user", "content": "pay", "idempotency_key": "k1"})
    assert stored_fields(again) == stored_fields(first)
    batch = mem.add_many(
        [
            {"role": "user", "content": "x", "idempotency_key": "k2"},
            {"role": "user", "content": "pay", "idempotency_key": "k1"},
        ]
    )
    assert [m.cursor for m in batch] == [2, 1]
    assert mem.count() == 2


def test_window_keeps_system_snapshot_and_whole_tool_groups(mem):
    mem.add({"role": "system", "content": "rules"})
    mem.add_many([{"role": "user", "content": f"early {i}"} for i in range(5)])
    snap = mem.save_snapshot(
        "they said hello", upto=6, pinned=[{"role": "user", "content": "task"}]
    )
    mem.add_many([{"role": "user", "content": f"later {i}"} for i in range(4)] + tool_turn("c9"))
    window = mem.window()
    assert window.snapshot_version == snap.version
    assert window.messages[0] == {"role": "system", "content": "rules"}
    assert window.messages[1]["content"].endswith("they said hello")
    assert window.messages[2] == {"role": "user", "content": "task"}
    assert window.cursors[3:] == list(range(7, 13))
    # Room for the summary, the pinned task and the tool group, one token short of message 10.
    tail = {m.cursor: m.tokens for m in mem.messages(after=6)}
    head = window.budget_tokens - sum(tail.values())
    small = mem.window(max_tokens=head + tail[11] + tail[12] + tail[10] - 1)
    assert small.cursors == [1, None, None, 11, 12]
    assert small.messages[0] == {"role": "system", "content": "rules"}


def test_window_keeps_every_system_message_in_log_order(mem):
    mem.add({"role": "system", "content": "first rules"})
    mem.add_many([{"role": "user", "content": f"u{i}"} for i in range(3)])
    mem.save_snapshot("summary", upto=3)
    mem.add({"role": "system", "content": "new rules"})
    mem.add_many([{"role": "user", "content": f"v{i}"} for i in range(3)])
    window = mem.window(max_tokens=10**6)
    assert [c for c in window.cursors if c is not None] == [1, 4, 5, 6, 7, 8]
    assert window.messages[0] == {"role": "system", "content": "first rules"}
    tight = mem.window(max_messages=1)
    assert [c for c in tight.cursors if c is not None] == [1, 5, 8]


@override_settings(MEMORY_APP={"WINDOW_PAGE_SIZE": 4})
def test_window_reads_further_pages_when_the_first_does_not_fill_it(mem):
    mem.add_many([{"role": "user", "content": "short"} for _ in range(5)])
    mem.add_many([{"role": "user", "content": "a much longer message " * 20} for _ in range(3)])
    mem.add_many([{"role": "user", "content": "short"} for _ in range(12)])
    everything = mem.window(max_tokens=10**6)
    assert everything.cursors == list(range(1, 21))
    budget = sum(m.tokens for m in mem.last(14))
    window = mem.window(max_tokens=budget)
    assert window.cursors == list(range(7, 21))
    assert window.budget_tokens == budget
    assert mem.window(max_messages=9).cursors == list(range(12, 21))


def test_window_of_an_empty_or_deleted_session(mem):
    assert mem.window(max_tokens=100).messages == []
    Session.objects.filter(pk=mem.id).delete()
    assert mem.window(max_tokens=100).messages == []


@pytest.mark.postgres
def test_hot_paths_are_single_round_trips(mem, django_assert_num_queries):
    mem.add_many(MIXED)
    with django_assert_num_queries(1):
        mem.add({"role": "user", "content": "hi"})
    with django_assert_num_queries(1):
        mem.add_many([{"role": "user", "content": "hi"}] * 50)
    with django_assert_num_queries(1):
        mem.last(50)
    # Counters, snapshot and system messages; then the tail's first page: two index reads.
    with django_assert_num_queries(2):
        mem.window(max_tokens=8000)
    assert connection.vendor == "postgresql"


def test_rows_decode_the_same_with_and_without_the_direct_constructor(mem, monkeypatch):
    from memory_app.store import statements

    mem.add_many(MIXED)
    direct = mem.last(len(MIXED))
    monkeypatch.setattr(statements, "_DIRECT", False)
    assert mem.last(len(MIXED)) == direct
    added = mem.add_many(MIXED[1:3]) + [mem.add(MIXED[1])]
    assert added == mem.last(3)
    assert direct[1].metadata == {"lang": "de"} and direct[0].metadata == {}
    assert direct[0].metadata is not direct[2].metadata  # never a shared dict


def test_reopened_handle_sees_the_same_log(mem, user):
    mem.add_many([{"role": "user", "content": f"m{i}"} for i in range(3)])
    again = Memory.session("test-session", owner=user, namespace="tests")
    assert [stored_fields(m) for m in again.last(3)] == [stored_fields(m) for m in mem.messages()]


@pytest.mark.postgres
def test_hot_statements_are_seen_by_execute_wrappers(mem):
    seen = []

    def spy(execute, sql, params, many, context):
        seen.append(sql.split()[0:2])
        return execute(sql, params, many, context)

    mem.add({"role": "user", "content": "before"})  # outside the wrapper: not seen
    logged = len(connection.queries_log)
    with connection.execute_wrapper(spy):
        mem.add({"role": "user", "content": "hi"})
        mem.add_many([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        assert [m.content for m in mem.last(2)] == ["a", "b"]
    assert len(seen) == 3  # two appends and one read, each one statement
    assert seen[0] == seen[1] == ["WITH", "bumped"] and seen[2][0] == "SELECT"
    assert len(connection.queries_log) == logged  # a wrapper is not query logging (DEBUG off)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_failed_append_leaves_no_gap_and_the_next_one_works(user):
    """A statement that fails (here: the session row is locked and the lock timeout is short)
    stores nothing and spends no cursor; the same connection appends next as if it had not."""
    from django.db import OperationalError, connections

    mem = Memory.session("failed-append", owner=user, namespace="tests")
    mem.add({"role": "user", "content": "one"})
    other = connections.create_connection("default")  # a second connection: another client
    try:
        other.set_autocommit(False)
        with other.cursor() as locker:
            locker.execute("SELECT 1 FROM memory_app_session WHERE id = %s FOR UPDATE", [mem.id])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")
        with pytest.raises(OperationalError):
            mem.add({"role": "user", "content": "lost to the lock"})
        other.rollback()
    finally:
        other.close()
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
    assert mem.add({"role": "user", "content": "two"}).cursor == 2
    connection.close()  # a reopened connection gets a cursor of its own
    assert mem.add({"role": "user", "content": "three"}).cursor == 3
    assert [(m.cursor, m.content) for m in mem.messages()] == [(1, "one"), (2, "two"), (3, "three")]


@pytest.mark.postgres
@pytest.mark.skipif(
    os.environ.get("DB_TRANSACTION_POOLER") == "1",
    reason="a direct connection's prepared statements (tests/store/test_pooler.py: through one)",
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("prepare", [True, False])
def test_hot_statements_are_prepared_whatever_djangos_threshold(user, prepare):
    """Django's default prepare_threshold (None) makes psycopg ignore prepare=True; the store
    prepares its own statements anyway (PREPARE_STATEMENTS), and only those."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = options.get("prepare_threshold", "unset")
    connection.close()
    options["prepare_threshold"] = None
    try:
        with override_settings(MEMORY_APP={"PREPARE_STATEMENTS": prepare}):
            mem = Memory.session("prepared", owner=user)
            mem.add({"role": "user", "content": "first"})
            mem.last(5)
            for _ in range(10):  # more than any threshold: Django's own query stays unprepared
                Session.objects.filter(pk=mem.id).exists()
            with connection.cursor() as cursor:
                cursor.execute("SELECT statement FROM pg_prepared_statements")
                prepared = [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()
        if saved == "unset":
            options.pop("prepare_threshold")
        else:
            options["prepare_threshold"] = saved
    if prepare:
        assert any("WITH bumped AS" in sql for sql in prepared), prepared
        assert not any("EXISTS" in sql.upper() or "LIMIT 1" in sql for sql in prepared), prepared
    else:
        assert prepared == []
