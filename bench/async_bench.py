"""Async callers: ``aadd``/``awindow`` against the async APIs of langchain-postgres and the
OpenAI Agents SDK, and against memory_app's own append statement sent from an async driver
(what a native async path could reach at best).

    python bench/async_bench.py            # 400 single appends, 5 rounds of 16 tasks x 100 appends
    python bench/async_bench.py --tasks 32

Everything runs in one event loop, as an async agent server would. Workloads:

- one task: single appends one after another (median and p99 latency);
- N tasks on N sessions at once, 100 appends each, the median of 5 rounds in which the stores
  take turns (messages per second; every message is then looked for, and memory_app's cursors
  must be 1..N in every session);
- ``awindow(max_tokens=8000)`` of a 1,000-message session (median).

Stores: memory_app's async twins (the sync code on a worker thread, ``sync_to_async``);
memory_app's append statement on ``psycopg.AsyncConnection`` (one connection per task, prepared:
the same SQL and parameters as ``add()``, none of its Python); langchain-postgres
``PostgresChatMessageHistory`` with an ``AsyncConnection`` per task; the Agents SDK's
``SQLAlchemySession`` on asyncpg (one engine, a pool of 20). The store-alone settings of
``store_bench.py``; ``synchronous_commit=off`` as there.

Writes ``results/async.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    RESULTS,
    fmt_ratio,
    libpq_params,
    markdown_table,
    percentile,
    setup_django,
    sqlalchemy_async_url,
)
from bench.store_bench import STORE_ONLY  # noqa: E402

MESSAGE = {
    "role": "user",
    "content": "The parcel to Oslo has not arrived; the tracking page says it left Lyon on "
    "Monday. Can you check where it is and when it should be delivered?",
}
RUN = uuid.uuid4().hex[:8]


# -- the stores ---------------------------------------------------------------------------------


class Ours:
    name = "memory_app aadd/awindow"

    async def setup(self, settings_dict):
        pass

    async def session(self, key):
        from memory_app import Memory

        return await Memory.asession(f"{RUN}-{key}", namespace="async-bench")

    async def writer(self, key):
        memory = await self.session(key)
        return memory.aadd, None

    async def append(self, session, message):
        await session.aadd(message)

    async def load(self, session, messages):
        await session.aadd_many(messages)

    async def window(self, session, max_tokens):
        return await session.awindow(max_tokens=max_tokens)

    async def stored(self, key):
        memory = await self.session(key)
        got = await memory.amessages()
        return [m.content for m in got], [m.cursor for m in got]

    async def close(self):
        pass


class NativeStatement:
    """memory_app's append statement from an async driver: the floor of a native async path."""

    name = "memory_app's append statement on psycopg AsyncConnection"

    async def setup(self, settings_dict):
        import psycopg

        from memory_app.store.statements import statements

        self.params = {**libpq_params(settings_dict), "options": "-c synchronous_commit=off"}
        self.sql = statements().append_one
        self.conn = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)

    async def session(self, key):
        from memory_app import Memory

        memory = await Memory.asession(f"{RUN}-native-{key}", namespace="async-bench")
        return memory.id

    def params_for(self, session_id, message):
        from django.utils import timezone

        from memory_app.tokens import count_message

        return {
            "n": 1,
            "tokens": count_message(message),
            "now": timezone.now(),
            "session": session_id,
            "ttls": None,
            "any_owner": True,
            "owner": None,
            "role": message["role"],
            "content": message["content"],
            "content_parts": None,
            "name": "",
            "tool_calls": None,
            "tool_call_id": "",
            "extra": None,
            "metadata": "{}",
            "remember": False,
            "idempotency_key": None,
        }

    async def append_on(self, conn, session_id, message):
        async with conn.cursor() as cursor:
            await cursor.execute(self.sql, self.params_for(session_id, message), prepare=True)
            await cursor.fetchall()

    async def append(self, session, message):
        await self.append_on(self.conn, session, message)

    async def writer(self, key):
        import psycopg

        conn = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
        session_id = await self.session(key)

        async def append(message):
            await self.append_on(conn, session_id, message)

        return append, conn.close

    async def load(self, session, messages):
        for message in messages:
            await self.append(session, message)

    window = None

    async def stored(self, key):
        from memory_app import Memory

        memory = await Memory.asession(f"{RUN}-native-{key}", namespace="async-bench")
        got = await memory.amessages()
        return [m.content for m in got], [m.cursor for m in got]

    async def close(self):
        await self.conn.close()


class Langchain:
    name = "langchain-postgres PostgresChatMessageHistory (AsyncConnection)"
    table = "bench_async_langchain"

    async def setup(self, settings_dict):
        import psycopg
        from langchain_postgres import PostgresChatMessageHistory

        self.params = {**libpq_params(settings_dict), "options": "-c synchronous_commit=off"}
        self.conn = await psycopg.AsyncConnection.connect(**self.params)
        await PostgresChatMessageHistory.acreate_tables(self.conn, self.table)

    def history(self, key, conn=None):
        from langchain_postgres import PostgresChatMessageHistory

        session_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{RUN}-{key}"))
        return PostgresChatMessageHistory(
            self.table, session_id, async_connection=conn or self.conn
        )

    @staticmethod
    def to_langchain(message):
        from bench.stores import LangchainStore

        return LangchainStore.to_langchain(message)

    async def session(self, key):
        return self.history(key)

    async def append(self, session, message):
        await session.aadd_messages([self.to_langchain(message)])

    async def writer(self, key):
        import psycopg

        conn = await psycopg.AsyncConnection.connect(**self.params)
        history = self.history(key, conn)

        async def append(message):
            await history.aadd_messages([self.to_langchain(message)])

        return append, conn.close

    async def load(self, session, messages):
        await session.aadd_messages([self.to_langchain(m) for m in messages])

    async def window(self, session, max_tokens):
        from bench.stores import LangchainStore, client_window

        messages = await session.aget_messages()  # no limit in its API: the whole session
        as_openai = [LangchainStore.to_openai(m) for m in reversed(messages)]
        return client_window(as_openai, max_tokens)

    async def stored(self, key):
        return [m.content for m in await self.history(key).aget_messages()], None

    async def close(self):
        await self.conn.close()


class Agents:
    name = "openai-agents SQLAlchemySession (asyncpg)"

    async def setup(self, settings_dict):
        from sqlalchemy.ext.asyncio import create_async_engine

        self.engine = create_async_engine(
            sqlalchemy_async_url(settings_dict, "asyncpg"),
            pool_size=20,
            max_overflow=0,
            connect_args={"server_settings": {"synchronous_commit": "off"}},
        )
        self.ready = False

    async def session(self, key):
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        session = SQLAlchemySession(
            f"{RUN}-{key}",
            engine=self.engine,
            create_tables=not self.ready,
            sessions_table="bench_async_agent_session",
            messages_table="bench_async_agent_message",
        )
        self.ready = True
        return session

    async def append(self, session, message):
        await session.add_items([dict(message)])

    async def writer(self, key):
        session = await self.session(key)
        return (lambda message: session.add_items([dict(message)])), None

    async def load(self, session, messages):
        await session.add_items([dict(m) for m in messages])

    async def window(self, session, max_tokens):
        from bench.stores import agents_window

        return await agents_window(session, max_tokens)

    async def stored(self, key):
        return [i["content"] for i in await (await self.session(key)).get_items()], None

    async def close(self):
        await self.engine.dispose()


# -- the workloads ------------------------------------------------------------------------------


async def single(store, count: int) -> list[float]:
    session = await store.session("single")
    for _ in range(10):
        await store.append(session, MESSAGE)
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        await store.append(session, MESSAGE)
        samples.append(time.perf_counter() - t0)
    return samples


async def concurrent(store, tasks: int, per_task: int, prefix: str) -> tuple[float, dict]:
    """``tasks`` tasks append ``per_task`` messages each, task ``i`` to session
    ``{prefix}-{i}``, all at once: messages per second, and what the check found."""
    writers = [await store.writer(f"{prefix}-{i}") for i in range(tasks)]

    async def run(index, append):
        for n in range(per_task):
            await append({"role": "user", "content": f"task {index} message {n}"})

    gc.collect()  # a full collection of earlier rounds' garbage does not land in this one
    t0 = time.perf_counter()
    await asyncio.gather(*(run(i, append) for i, (append, _) in enumerate(writers)))
    seconds = time.perf_counter() - t0
    for _, close in writers:
        if close is not None:
            await close()
    found = {"lost": 0, "doubled": 0, "gaps": 0}
    for i in range(tasks):
        contents, cursors = await store.stored(f"{prefix}-{i}")
        wanted = [f"task {i} message {n}" for n in range(per_task)]
        found["lost"] += sum(1 for w in wanted if w not in contents)
        found["doubled"] += len(contents) - len(set(contents))
        if cursors is not None and cursors != list(range(1, len(cursors) + 1)):
            found["gaps"] += 1
    return tasks * per_task / seconds, found


async def windows(store, count: int) -> list[float]:
    session = await store.session("window")
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {MESSAGE['content']}"}
        for i in range(1000)
    ]
    for start in range(0, 1000, 250):
        await store.load(session, history[start : start + 250])
    samples = []
    for _ in range(count + 3):
        t0 = time.perf_counter()
        kept = await store.window(session, 8000)
        samples.append(time.perf_counter() - t0)
    assert 100 < len(kept) < 1000, len(kept)
    return samples[3:]


async def run_all(args, settings_dict) -> list[dict]:
    stores = [Ours(), NativeStatement(), Langchain(), Agents()]
    rows = {store.name: {"name": store.name, "rates": []} for store in stores}
    for store in stores:
        await store.setup(settings_dict)
    try:
        for store in stores:
            row = rows[store.name]
            samples = await single(store, args.count)
            row["p50"], row["p99"] = statistics.median(samples), percentile(samples, 0.99)
            row["load_single"] = os.getloadavg()[0]
            if store.window is not None:
                row["window"] = statistics.median(await windows(store, 30))
        # The concurrent workload: rounds, the stores taking turns in a rotating order.
        checks = {name: {"lost": 0, "doubled": 0, "gaps": 0} for name in rows}
        for round_no in range(args.rounds):
            shift = round_no % len(stores)
            for store in stores[shift:] + stores[:shift]:
                rate, found = await concurrent(
                    store, args.tasks, args.per_task, f"r{round_no}-{uuid.uuid4().hex[:6]}"
                )
                rows[store.name]["rates"].append(rate)
                for key, value in found.items():
                    checks[store.name][key] += value
        for name, row in rows.items():
            row["rate"] = statistics.median(row["rates"])
            row["load_concurrent"] = os.getloadavg()[0]
            c = checks[name]
            row["check"] = f"lost {c['lost']}, doubled {c['doubled']}" + (
                f", sessions with cursor gaps {c['gaps']}" if c["gaps"] else ""
            )
            print(row)
    finally:
        for store in stores:
            await store.close()
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=400, help="single appends timed")
    parser.add_argument("--tasks", type=int, default=16, help="concurrent tasks")
    parser.add_argument("--per-task", type=int, default=100, help="appends per task")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the concurrent workload")
    args = parser.parse_args()
    load = os.getloadavg()
    started = time.perf_counter()
    settings_dict = setup_django(memory_app={**STORE_ONLY})
    # Prepared statements, as the peers' drivers use by default (store_bench's main column).
    settings_dict.setdefault("OPTIONS", {})["prepare_threshold"] = 5
    # Commits that do not wait for the disk, as for the peers' connections below.
    settings_dict["OPTIONS"]["options"] = "-c synchronous_commit=off"
    rows = asyncio.run(run_all(args, settings_dict))
    langchain = next(r for r in rows if r["name"].startswith("langchain"))
    table = markdown_table(
        [
            "store",
            "single append p50 (ms)",
            "p99 (ms)",
            f"{args.tasks} tasks on {args.tasks} sessions (msg/s)",
            "window 8k, 1,000 messages (ms)",
            "load average",
        ],
        [
            [
                r["name"],
                f"{r['p50'] * 1000:.2f} ({fmt_ratio(r['p50'] / langchain['p50'])})",
                f"{r['p99'] * 1000:.2f}",
                f"{r['rate']:,.0f} ({fmt_ratio(langchain['rate'] / r['rate'])}); {r['check']}",
                f"{r['window'] * 1000:.2f} ({fmt_ratio(r['window'] / langchain['window'])})"
                if "window" in r
                else "–",
                f"{r['load_single']:.1f} / {r['load_concurrent']:.1f}",
            ]
            for r in rows
        ],
    )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    text = f"""# Async benchmark

{table}

Ratios are to langchain-postgres's async history (1.00x; higher is slower).

- One event loop; each of the {args.tasks} tasks appends {args.per_task} messages to its own session; the figure is the median of {args.rounds} rounds, the stores taking turns in a rotating order (rounds: {"; ".join(r["name"] + ": " + ", ".join(f"{x:,.0f}" for x in r["rates"]) for r in rows)}). Every message is then looked for, and memory_app's cursors must be 1..N in every session. memory_app's `aadd` is the native async append (`store/async_log.py`: the rule book in the loop, the append statement on psycopg's `AsyncConnection`, a pool of `ASYNC_CONNECTIONS` per loop); `awindow` still runs the sync code with `sync_to_async`. The native-statement row sends `add()`'s own SQL from `psycopg.AsyncConnection` (a connection per task) with none of memory_app's Python (validation, token counting, the after-append hand-over): the floor of the native path.
- `prepare_threshold=5` in Django's `OPTIONS` (prepared statements, as the peers' drivers use by default).
- Load average: the 1-minute figure after the single appends and windows / after the concurrent rounds (2 cores).
- Store-alone settings (no broker, no embedding or summarizing on append); `synchronous_commit=off` for every store, as in `store_bench.py`.
- Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL {server}; load average at start {" ".join(f"{x:.1f}" for x in load)}; the run took {time.perf_counter() - started:.0f} s.

Reproduce: `python bench/async_bench.py --count {args.count} --tasks {args.tasks} --per-task {args.per_task} --rounds {args.rounds}`
"""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "async.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
