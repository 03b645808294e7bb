"""Where a single append's time goes: the database's share and Python's, against the floor.

    python bench/append_cost.py              # 3,000 appends each, about a minute
    python bench/append_cost.py --count 10000
    python bench/append_cost.py --words 750  # long messages (the token count grows with them)
    python bench/append_cost.py --text conversation --words 250  # real conversation text
    python bench/append_cost.py --cpus same  # this process and the server on one CPU

One process, one database (``bench``, as ``store_bench.py``), ``synchronous_commit=off``, the
same messages; the variants take turns ten appends at a time so load from elsewhere falls on
all of them alike:

- *floor*: raw psycopg, one prepared INSERT into a table with no session row (``RawStore``);
- *our statement, raw psycopg*: memory_app's append statement (the session row's cursor and
  counters bumped, the message inserted) sent by psycopg with no Python of ours around it:
  what the database costs for our rules;
- *langchain-postgres*: ``PostgresChatMessageHistory.add_messages`` (``LangchainStore``);
- *memory_app (store alone)*: ``SessionMemory.add`` with the store benchmark's settings
  (validation, token counting, the statement, the after-append hand-over);
- *memory_app (production path)*: the same call with the default ``MEMORY_APP`` and a Redis
  broker (importance scoring of user messages, the after-append job sent to the broker).

``--text conversation`` takes the words from real conversations instead of the benchmark's
support-chat vocabulary, which holds none of the phrases the importance scorer looks for.

``--cpus`` pins this process and the database server's processes (Linux, a server on this
machine): ``same`` puts them on one CPU, where the client's and the server's work add up and
the peer's lighter work shows; ``apart`` puts them on two, where every round trip waits for a
wake-up across CPUs and the peer's second round trip (its COMMIT) shows. Left to the OS
(``any``), a run lands in one case or the other, and the ratio with it.

Writes ``bench/results/append_cost.md`` (``append_cost-text-conversation-words-250.md`` and
so on with options).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import sys
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS,
    Latency,
    add_cpus_argument,
    cpu_placement,
    cpus_option,
    fmt_ms,
    fmt_ratio,
    libpq_params,
    markdown_table,
    results_suffix,
    setup_django,
)
from bench.store_bench import STORE_ONLY, make_messages, with_tokens  # noqa: E402
from bench.stores import BENCH_BROKER, OursStore  # noqa: E402


def variants(settings_dict: dict) -> dict:
    """name -> append(message): each on a connection of its own but memory_app's two, which
    share this thread's Django connection."""
    import psycopg
    from django.db import connection
    from psycopg.pq import Format

    from bench.stores import LangchainStore, RawStore, commit_setting
    from memory_app import Memory
    from memory_app.store import statements

    raw = RawStore()
    raw.setup(settings_dict)
    raw_session = raw.session(f"append-cost-{uuid.uuid4().hex}")
    langchain = LangchainStore()
    langchain.setup(settings_dict)
    langchain_session = langchain.session(f"append-cost-{uuid.uuid4().hex}")

    # Django's connection as the store benchmark configures it (prepared plans, no fsync wait).
    connection.close()
    options = connection.settings_dict.setdefault("OPTIONS", {})
    options.update(options=commit_setting(False), prepare_threshold=5)
    ours = Memory.session(f"append-cost-{uuid.uuid4().hex}", namespace="bench")
    statement_session = Memory.session(f"append-cost-{uuid.uuid4().hex}", namespace="bench")
    production_session = Memory.session(f"append-cost-{uuid.uuid4().hex}", namespace="bench")

    plain = psycopg.connect(
        **libpq_params(settings_dict), options=commit_setting(False), autocommit=True
    )
    cursor = psycopg.Cursor(plain)
    cursor.format = Format.BINARY
    sql = statements.statements().append_one

    def statement(m: dict) -> None:
        cursor.execute(
            sql,
            {
                "n": 1,
                "tokens": m["_tokens"],
                "now": dt.datetime.now(dt.UTC),
                "session": statement_session.id,
                "ttls": None,
                "any_owner": True,
                "owner": None,
                "role": m["role"],
                "content": m["content"],
                "content_parts": None,
                "name": "",
                "tool_calls": None,
                "tool_call_id": "",
                "extra": None,
                "metadata": "{}",
                "remember": False,
                "idempotency_key": None,
            },
            prepare=True,
        )
        cursor.fetchall()

    return {
        "floor (raw psycopg INSERT)": lambda m: raw.append(raw_session, m),
        "our statement, raw psycopg": statement,
        "langchain-postgres": lambda m: langchain.append(langchain_session, m),
        "memory_app (store alone)": lambda m: ours.add(
            {"role": m["role"], "content": m["content"]}
        ),
        PRODUCTION: lambda m: production_session.add({"role": m["role"], "content": m["content"]}),
    }


PRODUCTION = "memory_app (production path)"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000, help="appends per variant")
    parser.add_argument(
        "--words",
        type=int,
        help="every message this many words long (default: 4-120 words, about 60 tokens)",
    )
    parser.add_argument(
        "--text",
        choices=("bench", "conversation"),
        default="bench",
        help="words from the benchmark's vocabulary, or from real conversations",
    )
    add_cpus_argument(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_DEBUG", "0")  # DEBUG keeps a log of every query
    began = time.perf_counter()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    settings_dict = setup_django(memory_app=STORE_ONLY)
    with cpu_placement(settings_dict, args.cpus) as placement:
        text = _run(args, settings_dict, began, load, placement)
    RESULTS.mkdir(parents=True, exist_ok=True)
    options = (
        (f" --text {args.text}" if args.text != "bench" else "")
        + (f" --words {args.words}" if args.words else "")
        + cpus_option(args.cpus)
    )
    text += f"\nReproduce: `python bench/append_cost.py{options}`\n"
    (RESULTS / f"append_cost{results_suffix(options)}.md").write_text(text)
    print(text)


def _run(args, settings_dict, began: float, load: str, placement: str) -> str:
    appenders = variants(settings_dict)
    pool = with_tokens(make_messages(512, seed=7, system=False, words=args.words, text=args.text))
    production = OursStore(prepared=True, config="production")
    samples: dict[str, list[float]] = {name: [] for name in appenders}
    sent = 0
    for turn in range(-1, args.count // 10):  # turn -1 warms up (prepared plans, caches)
        for name, append in appenders.items():
            with production.configured() if name == PRODUCTION else contextlib.nullcontext():
                if name == PRODUCTION:  # untimed: the settings are read anew after the switch
                    append(pool[sent % len(pool)])
                for _ in range(10):
                    message = pool[sent % len(pool)]
                    sent += 1
                    started = time.perf_counter()
                    append(message)
                    if turn >= 0:
                        samples[name].append(time.perf_counter() - started)
    from memory_app.services import background

    background.wait_for_deferred()
    redis.Redis.from_url(BENCH_BROKER).flushdb()  # the after-append jobs no worker ran
    latencies = {name: Latency(s) for name, s in samples.items()}
    floor = latencies["floor (raw psycopg INSERT)"].median
    langchain = latencies["langchain-postgres"].median
    rows = [
        (
            name,
            fmt_ms(lat.median),
            fmt_ms(lat.p99),
            fmt_ratio(lat.median / floor),
            fmt_ratio(lat.median / langchain),
        )
        for name, lat in latencies.items()
    ]
    table = markdown_table(
        ["single append", "median (ms)", "p99 (ms)", "/ floor", "/ langchain-postgres"], rows
    )
    ours = latencies["memory_app (store alone)"].median
    database = latencies["our statement, raw psycopg"].median
    words = f"{args.words} words" if args.words else "4-120 words (about 60 tokens)"
    words += (
        " of real conversation" if args.text == "conversation" else " of the bench's vocabulary"
    )
    return (
        "# Where a single append's time goes\n\n"
        f"{table}\n\n"
        f"memory_app's own statement, sent with no Python of ours around it, takes "
        f"{fmt_ratio(database / floor)} the floor; the rest of an append "
        f"({fmt_ms(ours - database)} ms of {fmt_ms(ours)}) is what memory_app does around it: "
        "validation, token counting, Django's connection handling, the after-append hand-over, "
        "and the full-text job that the background thread runs meanwhile. The production path "
        "adds importance scoring of the user's messages and sends the after-append job to the "
        "broker.\n\n"
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average at start {load}; {args.count:,} appends "
        f"per variant, taking turns ten at a time; messages of {words}; this process and "
        f"the database server {placement}; the run took "
        f"{time.perf_counter() - began:.0f} s.\n"
    )


if __name__ == "__main__":
    main()
