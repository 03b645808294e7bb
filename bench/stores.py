"""The message stores the benchmark compares, behind one small interface.

- ``raw``: psycopg and one prepared statement per operation on a minimal table; the floor,
  what the database itself costs.
- ``ours``: this app's adapter (``memory_app.Memory``), through Django.
- ``langchain``: langchain-postgres's ``PostgresChatMessageHistory`` (psycopg 3).
- ``agents``: the OpenAI Agents SDK's ``SQLAlchemySession`` (SQLAlchemy async + asyncpg).

Every store gets the same messages (OpenAI-style role/content dicts, converted to the
store's own message type) in the same database. Token windows: ours builds them in the
database (``window(max_tokens=...)``); the others have no such call, so the benchmark
fetches what their API allows and cuts the window client-side, counting tokens with the same
tokenizer (see ``client_window``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .common import Latency, libpq_params, sqlalchemy_async_url, time_calls

NAMESPACE = uuid.UUID("5f1b0d3e-8c61-4d0c-a8a9-6d7f3f0e2b11")


def client_window(newest_first: Sequence[dict], max_tokens: int) -> list[dict]:
    """The newest messages whose tokens fit ``max_tokens`` (what a caller of a store without
    a window call computes itself), in log order."""
    from memory_app.tokens import count_message

    kept, used = [], 0
    for message in newest_first:
        cost = count_message(message)
        if used + cost > max_tokens:
            break
        kept.append(message)
        used += cost
    kept.reverse()
    return kept


def commit_setting(durable: bool) -> str:
    """libpq ``options``: whether a commit waits for its WAL flush (PostgreSQL's default) or
    not (the benchmark's default: the stores' own costs, without the disk's fsync latency)."""
    return f"-c synchronous_commit={'on' if durable else 'off'}"


class Store:
    name = ""
    title = ""
    concurrency = "threads"
    durable = False

    def setup(self, settings_dict: dict) -> None: ...
    def close(self) -> None: ...
    def session(self, key: str) -> Any: ...
    def append(self, session, message: dict) -> Any: ...
    def append_batch(self, session, messages: list[dict]) -> Any: ...
    def last(self, session, n: int) -> list: ...
    def window(self, session, max_tokens: int) -> list: ...
    def count(self, session) -> int: ...

    def load(self, session, messages: list[dict], batch: int = 1000) -> None:
        for start in range(0, len(messages), batch):
            self.append_batch(session, messages[start : start + batch])

    def measure(
        self, fn: Callable[[], Any], *, count: int, max_seconds: float, warmup: int = 6
    ) -> Latency:
        return time_calls(fn, count=count, max_seconds=max_seconds, warmup=warmup)

    # Concurrent writers: ``writer(key)`` returns (append, close) for one thread.
    def writer(self, key: str) -> tuple[Callable[[dict], Any], Callable[[], None]]:
        raise NotImplementedError

    def stored_contents(self, key: str) -> list[str]:
        """Contents of the session's messages, in the store's order."""
        raise NotImplementedError


# -- raw psycopg: the floor ---------------------------------------------------------------------


class RawStore(Store):
    name = "raw"
    title = "raw psycopg (floor)"
    table = "bench_raw_message"

    def setup(self, settings_dict):
        import psycopg

        self.params = {**libpq_params(settings_dict), "options": commit_setting(self.durable)}
        self.conn = psycopg.connect(**self.params, autocommit=True)
        self.conn.execute(f"""
            CREATE TABLE IF NOT EXISTS {self.table} (
                session_id uuid NOT NULL,
                id bigserial,
                role text NOT NULL,
                content text NOT NULL,
                token_count integer NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (session_id, id)
            )""")
        self.insert = (
            f"INSERT INTO {self.table} (session_id, role, content, token_count) "
            "VALUES (%s, %s, %s, %s)"
        )
        self.insert_many = (
            f"INSERT INTO {self.table} (session_id, role, content, token_count) "
            "SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::integer[])"
        )
        self.newest = (
            f"SELECT id, role, content, token_count, created_at FROM {self.table} "
            "WHERE session_id = %s ORDER BY id DESC LIMIT %s"
        )
        self.avg_tokens: dict[uuid.UUID, float] = {}

    def close(self):
        self.conn.close()

    def session(self, key):
        return uuid.uuid5(NAMESPACE, key)

    def append(self, session, message):
        self.conn.execute(
            self.insert,
            (session, message["role"], message["content"], message["_tokens"]),
            prepare=True,
        )

    def append_batch(self, session, messages):
        self.conn.execute(
            self.insert_many,
            (
                session,
                [m["role"] for m in messages],
                [m["content"] for m in messages],
                [m["_tokens"] for m in messages],
            ),
            prepare=True,
        )

    def last(self, session, n):
        rows = self.conn.execute(self.newest, (session, n), prepare=True).fetchall()
        rows.reverse()
        return rows

    def window(self, session, max_tokens):
        # Reads as many rows as the average message size says will fit (as ours does), then
        # keeps those within the budget using the stored counts.
        avg = self.avg_tokens.get(session)
        if avg is None:
            avg = (
                self.conn.execute(
                    f"SELECT avg(token_count) FROM {self.table} WHERE session_id = %s", (session,)
                ).fetchone()[0]
                or 1
            )
            self.avg_tokens[session] = float(avg)
        limit = 16 + math.ceil(1.1 * max_tokens / float(avg))
        rows = self.conn.execute(self.newest, (session, limit), prepare=True).fetchall()
        kept, used = [], 0
        for row in rows:
            if used + row[3] > max_tokens:
                break
            kept.append({"role": row[1], "content": row[2]})
            used += row[3]
        kept.reverse()
        return kept

    def count(self, session):
        return self.conn.execute(
            f"SELECT count(*) FROM {self.table} WHERE session_id = %s", (session,)
        ).fetchone()[0]

    def writer(self, key):
        import psycopg

        conn = psycopg.connect(**self.params, autocommit=True)
        session = self.session(key)

        def append(message):
            conn.execute(
                self.insert,
                (session, message["role"], message["content"], message["_tokens"]),
                prepare=True,
            )

        return append, conn.close

    def stored_contents(self, key):
        return [
            r[0]
            for r in self.conn.execute(
                f"SELECT content FROM {self.table} WHERE session_id = %s ORDER BY id",
                (self.session(key),),
            )
        ]


# -- this app ---------------------------------------------------------------------------------


def _plain(message: dict) -> dict:
    return {"role": message["role"], "content": message["content"]}


def _in_own_thread(method):
    """Run ``method`` on the store's own thread (its own Django connection) unless already there."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if threading.current_thread() is self.thread:
            return method(self, *args, **kwargs)
        return self.executor.submit(method, self, *args, **kwargs).result()

    return wrapper


#: The broker of the production variant: a Redis database of the benchmark's own, emptied after.
BENCH_BROKER = "redis://127.0.0.1:6379/15"


class OursStore(Store):
    """``memory_app.Memory``. ``prepared`` sets Django's ``OPTIONS["prepare_threshold"]`` (the
    documented switch for server-side prepared statements); without it Django's defaults.

    ``config``: ``"store"``, the store alone (the benchmark's ``MEMORY_APP``: no embedding, no
    summarize trigger, no importance scoring); ``"production"``, the default ``MEMORY_APP`` with
    a Redis broker configured and no worker running (each append schedules its after-append
    job as in production); ``"demo"``, the default ``MEMORY_APP`` with no broker (the job runs
    in this process's background thread, as in the demo; the benchmark waits for it after
    each turn, outside the timed calls, so its work does not fall on the other stores' turns).

    Each variant works on a thread of its own, so it keeps its own Django connection (with its
    options, its prepared statements and warm caches) while the stores take turns.
    """

    TITLES = {
        "store": "memory_app (prepare_threshold=5)",
        "production": "memory_app, production path (Redis broker, defaults)",
        "demo": "memory_app, no broker (defaults, the demo)",
    }

    def __init__(self, *, prepared: bool, config: str = "store") -> None:
        self.prepared = prepared
        self.config = config
        self.appends_only = config != "store"  # reads are the same code: measured once
        if config == "store":
            self.name = "ours" if prepared else "ours_default"
            self.title = self.TITLES[config] if prepared else "memory_app (Django defaults)"
        else:
            self.name = f"ours_{config}"
            self.title = self.TITLES[config]

    @contextlib.contextmanager
    def configured(self):
        """The variant's settings while it runs (the stores take turns, so one at a time)."""
        if self.config == "store":
            yield
            return
        from celery import current_app
        from django.test.utils import override_settings

        from memory_app.services import background

        conf = current_app.conf
        saved = (conf.task_always_eager, conf.broker_url)
        with override_settings(MEMORY_APP={}):
            if self.config == "production":
                conf.task_always_eager, conf.broker_url = False, BENCH_BROKER
            try:
                yield
            finally:
                # The hand-overs go out under the variant's own settings (to the broker), not
                # run in this process under the next variant's.
                background.wait_for_deferred()
                conf.task_always_eager, conf.broker_url = saved

    def setup(self, settings_dict):
        from concurrent.futures import ThreadPoolExecutor

        self.executor = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        self.thread = self.executor.submit(threading.current_thread).result()
        self.connect()

    def configure_connection(self):
        """Give this thread's Django connection the variant's own options."""
        from django.db import connection

        connection.close()
        connection.settings_dict = copy.deepcopy(connection.settings_dict)
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options["options"] = commit_setting(self.durable)
        if self.prepared:
            options["prepare_threshold"] = 5
        else:
            options.pop("prepare_threshold", None)

    @_in_own_thread
    def connect(self):
        from django.db import connection

        self.configure_connection()
        connection.ensure_connection()

    @_in_own_thread
    def session(self, key):
        from memory_app import Memory

        return Memory.session(key, namespace="bench")

    def append(self, session, message):
        return session.add(_plain(message))

    @_in_own_thread
    def append_batch(self, session, messages):
        return session.add_many([_plain(m) for m in messages])

    def last(self, session, n):
        return session.last(n)

    @_in_own_thread
    def window(self, session, max_tokens):
        return session.window(max_tokens=max_tokens).messages

    @_in_own_thread
    def count(self, session):
        return session.count()

    @_in_own_thread
    def load(self, session, messages, batch=1000):
        super().load(session, messages, batch)

    @_in_own_thread
    def measure(self, fn, *, count, max_seconds, warmup=6):
        with self.configured():
            return super().measure(fn, count=count, max_seconds=max_seconds, warmup=warmup)

    @_in_own_thread
    def close(self):
        from django.db import connection

        connection.close()
        if self.config == "production":
            import redis

            redis.Redis.from_url(BENCH_BROKER).flushdb()  # the tasks no worker ran

    def writer(self, key):
        from django.db import connection

        self.configure_connection()  # this writer thread's own connection, same options
        session = self.session.__wrapped__(self, key)

        def append(message):
            return session.add(_plain(message))

        return append, connection.close

    @_in_own_thread
    def stored_contents(self, key):
        return [m.content for m in self.session(key).messages()]

    @_in_own_thread
    def cursors(self, key) -> list[int]:
        return [m.cursor for m in self.session(key).messages()]


# -- langchain-postgres -------------------------------------------------------------------------


class LangchainStore(Store):
    name = "langchain"
    title = "langchain-postgres PostgresChatMessageHistory"
    table = "bench_langchain_message"

    def setup(self, settings_dict):
        import psycopg
        from langchain_postgres import PostgresChatMessageHistory

        self.params = {**libpq_params(settings_dict), "options": commit_setting(self.durable)}
        self.conn = psycopg.connect(**self.params)
        PostgresChatMessageHistory.create_tables(self.conn, self.table)

    def close(self):
        self.conn.close()

    @staticmethod
    def to_langchain(message: dict):
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

        kind = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}[
            message["role"]
        ]
        return kind(content=message["content"])

    @staticmethod
    def to_openai(message) -> dict:
        role = {"human": "user", "ai": "assistant", "system": "system"}[message.type]
        return {"role": role, "content": message.content}

    def history(self, key, conn=None):
        from langchain_postgres import PostgresChatMessageHistory

        return PostgresChatMessageHistory(
            self.table, str(uuid.uuid5(NAMESPACE, key)), sync_connection=conn or self.conn
        )

    def session(self, key):
        return self.history(key)

    def append(self, session, message):
        session.add_messages([self.to_langchain(message)])

    def append_batch(self, session, messages):
        session.add_messages([self.to_langchain(m) for m in messages])

    def last(self, session, n):
        # No limit in the API: every message of the session is read.
        return session.get_messages()[-n:]

    def window(self, session, max_tokens):
        messages = session.get_messages()
        return client_window([self.to_openai(m) for m in reversed(messages)], max_tokens)

    def count(self, session):
        with self.conn.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM {self.table} WHERE session_id = %s", (session._session_id,)
            )
            count = cursor.fetchone()[0]
        self.conn.commit()
        return count

    def writer(self, key):
        import psycopg

        conn = psycopg.connect(**self.params)
        history = self.history(key, conn)

        def append(message):
            history.add_messages([self.to_langchain(message)])

        return append, conn.close

    def stored_contents(self, key):
        return [m.content for m in self.history(key).get_messages()]


# -- OpenAI Agents SDK ---------------------------------------------------------------------------


async def agents_window(session, max_tokens: int) -> list[dict]:
    """A window from an Agents SDK session: ``get_items(limit)`` reads the newest items; the
    limit grows until the budget is full."""
    limit = 128
    while True:
        items = await session.get_items(limit=limit)
        kept = client_window(list(reversed(items)), max_tokens)
        if len(kept) < len(items) or len(items) < limit:
            return kept
        limit *= 2


class AgentsStore(Store):
    name = "agents"
    title = "openai-agents SQLAlchemySession (asyncpg)"
    concurrency = "asyncio tasks"

    def setup(self, settings_dict):
        from sqlalchemy.ext.asyncio import create_async_engine

        self.loop = asyncio.new_event_loop()
        self.url = sqlalchemy_async_url(settings_dict, "asyncpg")
        # Room for 16 concurrent writers without waiting on the pool.
        self.engine = create_async_engine(
            self.url,
            pool_size=20,
            max_overflow=0,
            connect_args={
                "server_settings": {"synchronous_commit": "on" if self.durable else "off"}
            },
        )
        self.tables_ready = False

    def close(self):
        self.run(self.engine.dispose())
        self.loop.close()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def session(self, key):
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        session = SQLAlchemySession(
            key,
            engine=self.engine,
            create_tables=not self.tables_ready,
            sessions_table="bench_agent_session",
            messages_table="bench_agent_message",
        )
        self.tables_ready = True
        return session

    @staticmethod
    def item(message: dict) -> dict:
        return {"role": message["role"], "content": message["content"]}

    def append(self, session, message):
        return session.add_items([self.item(message)])

    def append_batch(self, session, messages):
        return session.add_items([self.item(m) for m in messages])

    def last(self, session, n):
        return session.get_items(limit=n)

    def window(self, session, max_tokens):
        return agents_window(session, max_tokens)

    def count(self, session):
        return len(self.run(session.get_items()))

    def load(self, session, messages, batch=1000):
        for start in range(0, len(messages), batch):
            self.run(self.append_batch(session, messages[start : start + batch]))

    def measure(self, fn, *, count, max_seconds, warmup=6):
        """As ``time_calls``, inside the event loop (one loop entry per turn, not per call)."""

        def blocking(coro_fn):
            return lambda: self.loop.run_until_complete(coro_fn())

        if warmup:
            from .common import warm_up

            warm_up(blocking(fn), calls=warmup)

        async def timed() -> Latency:
            import time

            samples = []
            deadline = time.perf_counter() + max_seconds
            while len(samples) < count:
                start = time.perf_counter()
                await fn()
                end = time.perf_counter()
                samples.append(end - start)
                if end > deadline and (len(samples) >= 3 or samples[-1] > 1.0):
                    break
            return Latency(samples)

        return self.run(timed())

    def stored_contents(self, key):
        return [i["content"] for i in self.run(self.session(key).get_items())]


def concurrent_writes(
    store: Store,
    keys: list[str],
    messages_per_writer: int,
    make_message: Callable[[int, int], dict],
) -> float:
    """``len(keys)`` writers append ``messages_per_writer`` messages each, writer ``i`` to
    session ``keys[i]``, all at once; returns the wall time from the start signal to the
    last append."""
    import time

    if isinstance(store, AgentsStore):

        async def writer(i):
            session = store.session(keys[i])
            await start.wait()
            for j in range(messages_per_writer):
                await store.append(session, make_message(i, j))

        async def run_all():
            tasks = [asyncio.ensure_future(writer(i)) for i in range(len(keys))]
            await asyncio.sleep(0.2)
            began = time.perf_counter()
            start.set()
            await asyncio.gather(*tasks)
            return time.perf_counter() - began

        start = asyncio.Event()
        return store.run(run_all())

    barrier = threading.Barrier(len(keys) + 1)
    errors: list[BaseException] = []

    def work(i):
        append, close = store.writer(keys[i])
        try:
            barrier.wait()
            for j in range(messages_per_writer):
                append(make_message(i, j))
        except BaseException as err:  # reported below, after every thread has finished
            errors.append(err)
        finally:
            close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(keys))]
    for thread in threads:
        thread.start()
    barrier.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return elapsed
