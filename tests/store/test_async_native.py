"""Async appends on PostgreSQL go through psycopg's async driver, not a thread: the same rule
book, the same statement, the same after-append job; cancellation, ownership and connections
handled as the sync path handles them."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from django.test import override_settings

from memory_app import Memory
from memory_app.exceptions import InvalidMessage, SessionNotFound
from memory_app.models import Message
from memory_app.services import background
from memory_app.store import log

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the native async path is PostgreSQL's")


@pytest.fixture
def no_sync_append(monkeypatch):
    """The sync append refuses: whatever is stored came through the native path."""

    def refuse(*args, **kwargs):
        raise AssertionError("the sync append ran")

    monkeypatch.setattr(log, "append", refuse)


async def _close_thread_connections():
    await sync_to_async(connections.close_all)()


def _backends_among(pids: list[int]) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        return cursor.fetchone()[0]


def test_concurrent_tasks_append_natively_with_gapless_cursors(no_sync_append, user):
    async def scenario():
        shared = await Memory.asession("shared", owner=user)
        own = [await Memory.asession(f"own-{i}", owner=user) for i in range(8)]

        async def writer(i: int):
            for n in range(10):
                await shared.aadd({"role": "user", "content": f"{i}/{n}"})
                await own[i].aadd_many(
                    [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": "a"}]
                )

        await asyncio.gather(*(writer(i) for i in range(8)))
        stored = await shared.amessages()
        assert [m.cursor for m in stored] == list(range(1, 81))
        assert sorted(m.content for m in stored) == sorted(
            f"{i}/{n}" for i in range(8) for n in range(10)
        )
        for memory in own:
            assert [m.cursor for m in await memory.amessages()] == list(range(1, 21))
        assert await shared.acount() == 80
        await _close_thread_connections()

    asyncio.run(scenario())


def test_the_rule_book_and_ownership_hold(no_sync_append, user, other_user):
    async def scenario():
        memory = await Memory.asession("mine", owner=user)
        await memory.aadd({"role": "user", "content": "kept"})
        with pytest.raises(InvalidMessage):
            await memory.aadd({"role": "user", "content": "x", "tool_calls": "nope"})
        with pytest.raises(InvalidMessage):
            await memory.aadd_many([{"role": "user", "content": "ok"}, {"role": "robot"}])
        with pytest.raises(SessionNotFound):
            await Memory.aadd(memory.id, {"role": "user", "content": "x"}, owner=other_user)
        with pytest.raises(SessionNotFound):
            await Memory.aadd(
                "00000000-0000-0000-0000-000000000000", {"role": "user", "content": "x"}
            )
        stored = await Memory.aadd(memory.id, {"role": "user", "content": "by id"}, owner=user)
        assert stored.cursor == 2
        assert [m.content for m in await memory.amessages()] == ["kept", "by id"]
        await _close_thread_connections()

    asyncio.run(scenario())


def test_the_after_append_job_follows_a_native_append(no_sync_append, user):
    async def scenario():
        memory = await Memory.asession("indexed", owner=user)
        await memory.aadd({"role": "user", "content": "The parcel left Lyon on Monday."})
        await _close_thread_connections()
        return memory

    memory = asyncio.run(scenario())
    assert background.wait_for_deferred(timeout=30)
    row = Message.objects.get(session_id=memory.id)
    assert not row.index_pending and row.search_vector is not None
    assert [r.cursor for r in memory.search("parcel Lyon", mode="fulltext")] == [1]


def test_a_cancelled_native_append_waits_for_its_outcome(no_sync_append, user):
    memory = Memory.session("locked", owner=user)
    locked, release = threading.Event(), threading.Event()

    def hold_the_session_row():
        # Another connection (this thread's own) holds the row lock the append needs.
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM memory_app_session WHERE id = %s FOR UPDATE", [memory.id]
                )
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_session_row)
    holder.start()
    assert locked.wait(30)

    async def scenario():
        task = asyncio.create_task(memory.aadd({"role": "user", "content": "landed"}))
        # Wait until the statement waits on the lock, then cancel the caller.
        for _ in range(300):
            if await sync_to_async(_waiting_on_a_lock)():
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the append never reached the lock")
        task.cancel()
        await asyncio.sleep(0.2)
        assert not task.done()  # pending until the write's outcome is known
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _close_thread_connections()

    asyncio.run(scenario())
    holder.join(30)
    # The write had started: it landed, and the caller learnt so only once it had.
    assert [m.content for m in memory.messages()] == ["landed"]


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            ["%INSERT INTO memory_app_message%"],
        )
        return cursor.fetchone()[0] > 0


def test_a_loop_that_ends_ends_its_connections(user):
    from memory_app.store import async_log

    memory = Memory.session("pooled", owner=user)
    pooled = []  # the pools' connections, as each loop leaves them

    async def scenario():
        await asyncio.gather(*(memory.aadd({"role": "user", "content": str(i)}) for i in range(6)))
        loop = asyncio.get_running_loop()
        pooled.extend(
            (conn, conn.info.backend_pid)
            for pool in async_log._pools[loop].values()
            for conn in pool.idle
        )
        await _close_thread_connections()

    for _ in range(3):
        asyncio.run(scenario())
    gc.collect()
    assert memory.count() == 18
    assert pooled and all(conn.closed for conn, _ in pooled)  # none left open by the 3 loops
    if os.environ.get("DB_TRANSACTION_POOLER") != "1":  # a pooler keeps its server connections
        pids = [pid for _, pid in pooled]
        deadline = time.monotonic() + 10
        while _backends_among(pids) and time.monotonic() < deadline:
            time.sleep(0.05)  # the server ends a backend moments after its client leaves
        assert _backends_among(pids) == 0


def test_receivers_that_use_the_orm_run_on_djangos_async_orm_thread(no_sync_append, user):
    """A receiver of ``messages_appended`` that may use the ORM runs off the event loop, on the
    thread Django's own async ORM calls use: its connection is closed as theirs is, not left
    open on a pool thread of the loop."""
    from memory_app.signals import messages_appended

    seen = []

    def receiver(sender, session_id, messages, **kwargs):
        seen.append(
            (threading.current_thread(), Message.objects.filter(session_id=session_id).count())
        )

    messages_appended.connect(receiver, weak=False, dispatch_uid="test-orm-receiver")
    try:

        async def scenario():
            memory = await Memory.asession("announced", owner=user)
            await memory.aadd({"role": "user", "content": "one"})
            await memory.aadd({"role": "user", "content": "two"})
            orm_thread = await sync_to_async(threading.current_thread)()
            await _close_thread_connections()
            return orm_thread

        orm_thread = asyncio.run(scenario())
    finally:
        messages_appended.disconnect(dispatch_uid="test-orm-receiver")
    assert [count for _, count in seen] == [1, 2]
    assert all(thread is orm_thread for thread, _ in seen)


@override_settings(MEMORY_APP={"ASYNC_CONNECTIONS": 0})
def test_async_connections_zero_runs_the_sync_path(user, monkeypatch):
    calls = []
    sync_append = log.append
    monkeypatch.setattr(log, "append", lambda *a, **k: calls.append(a) or sync_append(*a, **k))
    memory = Memory.session("threaded", owner=user)

    async def scenario():
        await memory.aadd({"role": "user", "content": "on a thread"})
        await _close_thread_connections()

    asyncio.run(scenario())
    assert len(calls) == 1 and memory.count() == 1


def test_a_pooled_connection_keeps_its_cursor(no_sync_append, user):
    """Consecutive appends on one pooled connection share its binary cursor: its dumper and
    loader caches stay warm."""
    from memory_app.store import async_log

    async def scenario():
        memory = await Memory.asession("one-cursor", owner=user)
        await memory.aadd({"role": "user", "content": "message 0"})
        (pool,) = async_log._pools[asyncio.get_running_loop()].values()
        (first,) = pool.idle
        kept = first._memory_app_cursor
        for i in range(1, 5):
            await memory.aadd({"role": "user", "content": f"message {i}"})
            assert pool.idle == [first] and first._memory_app_cursor is kept
        await _close_thread_connections()

    asyncio.run(scenario())
    stored = Memory.session("one-cursor", owner=user).messages()
    assert [m.cursor for m in stored] == list(range(1, 6))


@pytest.mark.skipif(
    os.environ.get("DB_TRANSACTION_POOLER") == "1",
    reason="a pooler keeps its client's connection when the server ends the backend behind it",
)
def test_a_connection_the_server_ended_is_dropped_with_its_cursor(no_sync_append, user):
    """The append on it fails, the pool lets it go, and the next append gets a fresh connection
    and cursor and is stored after the ones before."""
    from django.db import OperationalError

    from memory_app.store import async_log

    async def scenario():
        memory = await Memory.asession("ended", owner=user)
        await memory.aadd({"role": "user", "content": "before"})
        (pool,) = async_log._pools[asyncio.get_running_loop()].values()
        (first,) = pool.idle
        kept = first._memory_app_cursor

        # The server ends that backend (a restart, an idle timeout, an administrator).
        await sync_to_async(_terminate_backend)(first.info.backend_pid)
        with pytest.raises(OperationalError):
            await memory.aadd({"role": "user", "content": "lost with its connection"})
        assert first.closed and not pool.idle

        await memory.aadd({"role": "user", "content": "after the failure"})
        (second,) = pool.idle
        assert second is not first and second._memory_app_cursor is not kept
        await _close_thread_connections()

    asyncio.run(scenario())
    stored = Memory.session("ended", owner=user).messages()
    assert [(m.cursor, m.content) for m in stored] == [(1, "before"), (2, "after the failure")]


def _terminate_backend(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while _backends_among([pid]) and time.monotonic() < deadline:
        time.sleep(0.01)
