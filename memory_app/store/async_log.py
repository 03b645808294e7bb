"""Native async appends: the append statement sent from psycopg's async driver.

``aadd``/``aadd_many`` (and the integrations' async writes) used to run the sync append on
the one thread ``sync_to_async`` keeps for Django code, so an event loop's concurrent writers
waited for each other and for a thread hop each. Here the same rule book runs in the loop
(``check_message``, importance, token counts, encryption: all plain Python) and the same
statement (``log.append_statement``) goes to the database on an ``AsyncConnection`` of this
loop's own small pool, opened from the Django settings of the database the router picks for
writes. What follows is the sync path's: ``messages_appended`` is sent (on a worker thread,
so receivers may use the ORM) and the after-append job is scheduled.

Not native (run as sync code on a thread, as before): other databases, idempotency keys
(their lookup and retry need a transaction), async code called from sync code
(``async_to_sync``: that code may be inside ``atomic()``, and the write joins its
transaction), ``ASYNC_CONNECTIONS = 0``. A caller cancelled meanwhile gets
``CancelledError`` only once the write's outcome is known (``aio``).
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, router

from ..aio import outlive_cancellation, run_write
from ..conf import memory_settings
from ..encryption import decrypt_row, encrypt_row
from ..importance import mark_important
from ..models import Message, Session
from ..signals import messages_appended
from ..tokens import count_message
from ..types import ANY_OWNER, NewMessage, StoredMessage
from ..validation import check_message, check_messages
from . import log, sessions
from .statements import PREPARED_STATEMENT_ERRORS, prepare_for, refused


async def aadd(session_id, message: dict[str, Any], *, owner: Any = ANY_OWNER) -> StoredMessage:
    """``log.add`` for async callers."""
    return (await aappend(session_id, [check_message(message)], owner=owner))[0]


async def aadd_many(
    session_id, messages: Iterable[dict[str, Any]], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    """``log.add_many`` for async callers: all or none."""
    return await aappend(session_id, check_messages(messages), owner=owner)


async def aappend(
    session_id, messages: list[NewMessage], *, owner: Any = ANY_OWNER
) -> list[StoredMessage]:
    """``log.append`` for async callers, natively where it can be (see the module's text)."""
    alias = router.db_for_write(Message)
    if (
        memory_settings.ASYNC_CONNECTIONS == 0
        or connections[alias].vendor != "postgresql"
        or _called_from_sync_code()
        or any(m.idempotency_key for m in messages)
    ):
        return await run_write(log.append, session_id, messages, owner=owner)
    session_id = sessions.checked_id(session_id)
    messages = mark_important(messages)
    tokens = [count_message(m.as_openai()) for m in messages]
    return await outlive_cancellation(_write(alias, session_id, messages, tokens, owner))


def _called_from_sync_code() -> bool:
    """Whether this loop runs for sync code (``async_to_sync``): that code may be inside
    ``atomic()``, and the write must then join its transaction, on its thread's connection,
    as ``sync_to_async`` does. asgiref keeps that thread's executor for the loop's tasks."""
    from asgiref.sync import AsyncToSync

    return getattr(AsyncToSync.executors, "current", None) is not None


async def _write(alias, session_id, messages, tokens, owner) -> list[StoredMessage]:
    messages = [encrypt_row(m) for m in messages]
    sql, params = log.append_statement(session_id, messages, tokens, owner)
    async with connection_for(alias) as conn:
        cursor = _statement_cursor(conn)
        with connections[alias].wrap_database_errors:  # psycopg's errors as Django's
            prepare = prepare_for(alias, conn)
            try:
                await cursor.execute(sql, params, prepare=prepare)
            except PREPARED_STATEMENT_ERRORS:  # a pooler without them (see statements)
                if not refused(alias, prepare):
                    raise
                await cursor.execute(sql, params, prepare=False)  # autocommit: safe again
            result = await cursor.fetchall()
    tokens_since, written = log.placed(session_id, messages, tokens, result)
    written = [decrypt_row(m) for m in written]
    if _receivers_run_in_loop():
        log.announce(session_id, written, tokens_since, committed=True)
    else:  # a receiver may use the ORM: not in the event loop, but on the thread Django's
        # own async ORM calls use, whose connection is closed as theirs is (a pool thread's
        # would stay open, unseen, until the thread's end)
        await sync_to_async(log.announce)(session_id, written, tokens_since, committed=True)
    return written


def _statement_cursor(conn):
    """The binary cursor kept on a pooled connection (one task uses a connection at a time):
    a fresh cursor per append would start with empty dumper and loader caches, as the sync
    path's ``statements._statement_cursor`` explains."""
    cursor = getattr(conn, "_memory_app_cursor", None)
    if cursor is None or cursor.closed:
        cursor = conn._memory_app_cursor = conn.cursor(binary=True)
    return cursor


def _receivers_run_in_loop() -> bool:
    """Whether every receiver of ``messages_appended`` says it may run in an event loop (a
    ``runs_in_event_loop()`` that returns true: the app's own hands the session to a thread);
    a thread hop costs more than the append's own statement."""
    try:
        sync_receivers, async_receivers = messages_appended._live_receivers(Session)
    except Exception:  # noqa: BLE001 (a Django without it: take the thread)
        return False
    return not async_receivers and all(
        getattr(receiver, "runs_in_event_loop", lambda: False)() for receiver in sync_receivers
    )


# ---- connections: a small pool per event loop and database -------------------------------------
# A loop's idle connections end when it shuts down (``connection_for``). Nothing in a pool
# refers to its loop (no asyncio lock or semaphore binds to it: the slots are counted by hand,
# each waiter's future is dropped once woken), so a loop that ends is collected with its pools.
class _Pool:
    def __init__(self, alias: str, size: int) -> None:
        self.alias = alias
        self.idle: list = []
        self.free = size
        self.waiters: collections.deque[asyncio.Future] = collections.deque()

    async def connect(self):
        from psycopg import AsyncConnection, sql

        wrapper = connections[self.alias]
        params = wrapper.get_connection_params()
        params.pop("cursor_factory", None)  # Django's sync cursor class
        conn = await AsyncConnection.connect(**params, autocommit=True)
        # The session settings Django gives its own connections (init_connection_state).
        zone = wrapper.timezone_name
        if zone and conn.info.parameter_status("TimeZone") != zone:
            await conn.execute("SELECT set_config('TimeZone', %s, false)", [zone])
        role = wrapper.settings_dict["OPTIONS"].get("assume_role")
        if role:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        return conn

    async def _take_slot(self) -> None:
        while self.free == 0:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
        self.free -= 1

    def _give_slot(self) -> None:
        self.free += 1
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        from psycopg.pq import TransactionStatus

        await self._take_slot()
        try:
            conn = self.idle.pop() if self.idle else None
            if conn is not None and conn.closed:
                conn = None
            if conn is None:
                with connections[self.alias].wrap_database_errors:
                    conn = await self.connect()
            try:
                yield conn
            except BaseException:
                await _close(conn)  # in an unknown state after an error: not reused
                raise
            if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
                await _close(conn)
            else:
                self.idle.append(conn)
        finally:
            self._give_slot()

    def close_idle(self) -> None:
        # Without the loop (it has ended): end the sockets themselves.
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                conn.pgconn.finish()


async def _close(conn) -> None:
    try:
        await conn.close()
    except Exception:  # noqa: BLE001 (closing a broken connection may fail: it is gone anyway)
        pass


class _LoopPools(dict):
    """One event loop's pools by database alias, and the generator that closes them."""

    closer: Any = None


_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@asynccontextmanager
async def connection_for(alias: str) -> AsyncIterator[Any]:
    """An ``AsyncConnection`` to ``alias`` (autocommit) from this event loop's pool."""
    loop = asyncio.get_running_loop()
    pools = _pools.get(loop)
    if pools is None:
        pools = _pools[loop] = _LoopPools()
        # A loop that shuts down (asyncio.run does it) closes its async generators: this one
        # then ends the pools' idle connections while the loop still runs. A loop collected
        # without shutting down ends them through its finalizer.
        pools.closer = _close_at_shutdown(pools)
        await pools.closer.asend(None)  # first step: the loop now tracks it
        weakref.finalize(loop, _close_all, pools)
    pool = pools.get(alias)
    if pool is None:
        pool = pools[alias] = _Pool(alias, memory_settings.ASYNC_CONNECTIONS)
    async with pool.connection() as conn:
        yield conn


async def _close_at_shutdown(pools: dict) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for pool in pools.values():
            while pool.idle:
                await _close(pool.idle.pop())


def _close_all(pools: dict) -> None:
    for pool in pools.values():
        pool.close_idle()
