"""One Agents SDK session contract, two stores: our ``MemorySession`` and the SDK's
``SQLiteSession``.

Every behaviour test runs against both (``[memory]`` and ``[sqlite]``), so where our store
differs from the SDK's reference store a pair shows one passing and one failing case.

Cancellation is tested with a real concurrent writer: another database connection holds the
lock the write needs (the session's row on PostgreSQL, the database's write lock in SQLite),
so the write is really in flight on its thread when the task is cancelled.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys

import pytest
from asgiref.sync import async_to_sync

pytest.importorskip("agents")

from agents.memory import SQLiteSession  # noqa: E402

from memory_app import Memory  # noqa: E402
from memory_app.integrations import agents as integration  # noqa: E402
from memory_app.integrations.agents import MemorySession  # noqa: E402
from tests.integrations.conftest import RowLock, cancel_in_flight, settle  # noqa: E402


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(text: str, n: int) -> dict:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


ITEMS = [
    user("one"),
    reply("two", 2),
    user("three"),
    {"type": "function_call", "call_id": "c4", "name": "look", "arguments": '{"q": 4}'},
    {"type": "function_call_output", "call_id": "c4", "output": "four"},
    reply("five", 5),
]

STORES = ["memory", "sqlite"]


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    """``make(session_settings=None)``: a new, empty session of the store under test."""
    opened: list = []

    def make(session_settings=None):
        if request.param == "sqlite":
            session = SQLiteSession(f"contract-{len(opened)}", session_settings=session_settings)
            opened.append(session)
            return session
        request.getfixturevalue("db")
        return MemorySession.open(
            f"contract-{len(opened)}", namespace="contract", session_settings=session_settings
        )

    yield make
    for session in opened:
        session.close()


def run(coroutine_function, *args):
    return async_to_sync(coroutine_function)(*args)


# ---- add / get / limit / pop / clear ----------------------------------------------------------
def test_items_come_back_in_order_and_equal(store):
    session = store()
    run(session.add_items, ITEMS[:2])
    run(session.add_items, [])
    run(session.add_items, ITEMS[2:])
    assert run(session.get_items) == ITEMS


def test_limit_gives_the_newest_items_oldest_first(store):
    session = store()
    run(session.add_items, ITEMS)
    assert run(session.get_items, 2) == ITEMS[-2:]
    assert run(session.get_items, 1) == ITEMS[-1:]
    assert run(session.get_items, 100) == ITEMS
    assert run(session.get_items, 0) == []
    assert run(session.get_items, -1) == ITEMS  # a negative limit is no limit, as in SQLite


def test_settings_limit_is_the_default_and_an_explicit_limit_wins(store):
    session = store(session_settings={"limit": 3})
    run(session.add_items, ITEMS)
    assert run(session.get_items) == ITEMS[-3:]
    assert run(session.get_items, 5) == ITEMS[-5:]


def test_pop_takes_the_newest_item_and_later_items_go_after_the_rest(store):
    session = store()
    assert run(session.pop_item) is None
    run(session.add_items, ITEMS[:3])
    assert run(session.pop_item) == ITEMS[2]
    assert run(session.pop_item) == ITEMS[1]
    run(session.add_items, [user("again")])
    assert run(session.get_items) == [ITEMS[0], user("again")]


def test_clear_empties_the_session_and_it_stays_usable(store):
    session = store()
    run(session.add_items, ITEMS)
    run(session.clear_session)
    assert run(session.get_items) == []
    assert run(session.pop_item) is None
    run(session.add_items, [user("fresh start")])
    assert run(session.get_items) == [user("fresh start")]


# ---- session settings -------------------------------------------------------------------------
def test_unknown_session_settings_raise(store):
    with pytest.raises(TypeError, match=r"^Unknown session settings: limitt$"):
        store(session_settings={"limitt": 1})
    with pytest.raises(TypeError, match=r"^Unknown session settings: aa, zz$"):
        store(session_settings={"zz": 1, "limit": 2, "aa": 3})


def test_settings_may_be_given_as_sessionsettings(store):
    session = store(session_settings=integration.SessionSettings(limit=1))
    run(session.add_items, ITEMS)
    assert run(session.get_items) == ITEMS[-1:]


def test_unknown_settings_are_refused_on_sdk_versions_without_sessionsettings(db, monkeypatch):
    """Older SDK versions the extra allows have no ``SessionSettings``: the stand-in is as
    strict."""
    monkeypatch.setattr(integration, "SessionSettings", integration._Settings)
    mem = Memory.session("old-sdk", namespace="contract")
    with pytest.raises(TypeError, match=r"^Unknown session settings: limitt$"):
        MemorySession(mem, session_settings={"limitt": 1})
    assert MemorySession(mem, session_settings={"limit": 2}).session_settings.limit == 2
    assert MemorySession(mem).session_settings.limit is None
    with pytest.raises(TypeError, match="must be a _Settings instance or a dict"):
        MemorySession(mem, session_settings=3)
    assert not Memory.sessions(namespace="contract")[0].message_count


# ---- cancellation -----------------------------------------------------------------------------
#: The SDK's functions whose first statement writes (so waits for the lock another connection
#: holds): a thread whose innermost Python frame is one of them is inside that statement.
SDK_WRITERS = {"_insert_items", "_pop_item_sync", "_clear_session_sync"}


def _a_thread_is_writing_to_sqlite() -> bool:
    for frame in sys._current_frames().values():
        code = frame.f_code
        if code.co_name in SDK_WRITERS and code.co_filename.endswith("sqlite_session.py"):
            return True
    return False


class SQLiteWriteLock:
    """Another SQLite connection holds the database's write lock (``BEGIN IMMEDIATE``)."""

    def __init__(self, path) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None)

    def __enter__(self) -> SQLiteWriteLock:
        self.connection.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc) -> None:
        if self.connection.in_transaction:
            self.connection.execute("COMMIT")
        self.connection.close()

    async def wait_until_the_write_waits(self) -> None:
        # SQLite lists no waiters: look for the SDK's thread inside its first write statement
        # (SQLite's busy handler keeps it there while this connection holds the lock).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not _a_thread_is_writing_to_sqlite():
            assert loop.time() < deadline, "the write never reached the lock"
            await asyncio.sleep(0.005)

    async def let_it(self, task: asyncio.Future, *, succeed: bool) -> None:
        if not succeed:  # keep the lock past the writer's busy timeout (5 s): the write fails
            await asyncio.wait({task}, timeout=15)
        self.connection.execute("COMMIT")


# Our store's cancellation tests need committed data: the lock is taken by another connection.
@pytest.fixture(
    params=[
        pytest.param(
            "memory", marks=[pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
        ),
        "sqlite",
    ]
)
def locked_store(request, tmp_path):
    """``(session, lock)``: a session holding ITEMS[:3], and a context manager holding its write
    lock."""
    if request.param == "sqlite":
        path = tmp_path / "reference.sqlite"
        session = SQLiteSession("contract", db_path=path)
        run(session.add_items, ITEMS[:3])
        yield session, lambda: SQLiteWriteLock(path)
        session.close()
        return
    session = MemorySession.open("contract-cancel", namespace="contract")
    run(session.add_items, ITEMS[:3])
    yield session, lambda: RowLock(session.memory.id)


@pytest.mark.parametrize("succeed", [True, False], ids=["write-lands", "write-fails"])
def test_a_cancelled_add_waits_for_its_outcome(locked_store, succeed):
    session, lock = locked_store
    more = [user("four"), reply("five", 5)]

    async def scenario():
        pending = await cancel_in_flight(lambda: session.add_items(more), lock(), succeed=succeed)
        return pending, await session.get_items()

    pending, items = run(scenario)
    assert pending, "the cancelled task was done while its write was still on its way"
    if succeed:
        assert items == ITEMS[:3] + more  # fully there
    else:
        assert not any(item in items for item in more)  # absent


def test_a_cancelled_pop_waits_for_its_outcome(locked_store):
    session, lock = locked_store

    async def scenario():
        pending = await cancel_in_flight(session.pop_item, lock())
        return pending, await session.get_items()

    pending, items = run(scenario)
    assert pending
    assert items == ITEMS[:2]


def test_a_cancelled_clear_waits_for_its_outcome(locked_store):
    session, lock = locked_store

    async def scenario():
        pending = await cancel_in_flight(session.clear_session, lock())
        return pending, await session.get_items()

    pending, items = run(scenario)
    assert pending
    assert items == []


def test_a_write_cancelled_twice_still_waits_and_raises_once(locked_store):
    session, lock = locked_store

    async def scenario():
        with lock() as held:
            task = asyncio.ensure_future(session.add_items([user("four")]))
            await held.wait_until_the_write_waits()
            task.cancel()
            await settle()
            task.cancel()
            await settle()
            pending = not task.done()
            await held.let_it(task, succeed=True)
            with pytest.raises(asyncio.CancelledError):
                await task
        return pending, await session.get_items()

    pending, items = run(scenario)
    assert pending
    assert items == [*ITEMS[:3], user("four")]
