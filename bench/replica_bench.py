"""One primary vs primary + hot standby, for a read-heavy mix.

    python bench/replica_bench.py                 # 4 workers x 300 operations, each mode 3 times
    python bench/replica_bench.py --workers 2 --ops 100

Starts its own primary and streaming hot standby on loopback (``tests/replica.py``, the
embedded server's binaries), loads one owner's sessions, then runs the same bounded mix in
worker processes (each a Django process with ``DATABASE_URL`` and ``REPLICA_DATABASE_URL``, so
``memory_app.routers.MemoryRouter`` is on) ``--rounds`` times per mode, alternating:

- ``primary``: ``READ_REPLICAS`` empty, every query on the primary;
- ``replica``: stale-tolerant reads on the standby, the agent path on the primary.

The mix per operation, drawn from a seeded generator: 45% owner-scope search (hybrid), 25% an
admin-like session list (the changelist's query: newest 50 sessions with their counters, under
``stale_reads()``), 25% an agent window (``max_tokens=2000``), 5% an append. Throughput is
operations per second over all workers; latencies are per kind. Both servers share this
machine's cores, so the replica adds no hardware here: the figures show what the routing costs
and where the queries go, not the capacity a second machine would add. Writes ``results/replica.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
KINDS = ("owner_search", "admin_list", "window", "append")
WEIGHTS = (45, 25, 25, 5)
WORDS = (
    "parcel courier refund invoice address delivery tracking warehouse label customs "
    "payment card voucher return exchange size colour damage late early"
).split()


def worker(mode: str, ops: int, seed: int) -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connections

    from memory_app import Memory
    from memory_app.models import Session
    from memory_app.routers import stale_reads, unpinned

    if mode == "primary":
        settings.MEMORY_APP = {**settings.MEMORY_APP, "READ_REPLICAS": []}
    owner = get_user_model()._default_manager.get(username="bench")
    ids = list(Session.objects.filter(owner=owner).values_list("pk", flat=True))
    rng = random.Random(seed)
    timings: dict[str, list[float]] = {kind: [] for kind in KINDS}
    counts = {"primary": 0, "replica": 0}

    def count_queries(alias):
        def wrapper(execute, sql, params, many, context):
            counts[alias] += 1
            return execute(sql, params, many, context)

        return wrapper

    wrappers = [
        connections[a].execute_wrapper(count_queries(k))
        for a, k in (("default", "primary"), ("replica", "replica"))
    ]
    for w in wrappers:
        w.__enter__()
    started = time.perf_counter()
    for _ in range(ops):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        sid = rng.choice(ids)
        t0 = time.perf_counter()
        with unpinned():  # each operation is its own request or task
            if kind == "owner_search":
                Memory.get(sid, owner=owner).search(
                    " ".join(rng.sample(WORDS, 2)), scope="owner", limit=10
                )
            elif kind == "admin_list":
                with stale_reads():
                    list(
                        Session.objects.select_related("owner")
                        .order_by("-updated_at")
                        .values(
                            "pk",
                            "key",
                            "title",
                            "message_count",
                            "token_count",
                            "updated_at",
                            "owner__username",
                        )[:50]
                    )
            elif kind == "window":
                Memory.get(sid, owner=owner).window(max_tokens=2000)
            else:
                Memory.get(sid, owner=owner).add(
                    {"role": "user", "content": " ".join(rng.sample(WORDS, 6))}
                )
        timings[kind].append((time.perf_counter() - t0) * 1000)
    elapsed = time.perf_counter() - started
    for w in wrappers:
        w.__exit__(None, None, None)
    return {"elapsed": elapsed, "ops": ops, "timings": timings, "queries": counts}


def load(sessions: int, messages: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from memory_app import Memory

    call_command("migrate", verbosity=0)
    owner = get_user_model()._default_manager.create_user("bench", password="pw")
    rng = random.Random(0)
    for s in range(sessions):
        mem = Memory.session(f"s{s}", owner=owner, namespace="bench")
        mem.add_many(
            [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": " ".join(rng.sample(WORDS, 8)),
                }
                for i in range(messages)
            ]
        )


def run_mode(env: dict, mode: str, workers: int, ops: int, round_: int) -> dict:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                mode,
                "--ops",
                str(ops),
                "--seed",
                str(1000 * round_ + i),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(workers)
    ]
    started = time.perf_counter()
    results = [json.loads(p.communicate(timeout=900)[0].strip().splitlines()[-1]) for p in procs]
    wall = time.perf_counter() - started
    merged = {kind: [t for r in results for t in r["timings"][kind]] for kind in KINDS}
    total_ops = sum(r["ops"] for r in results)
    return {
        "mode": mode,
        "throughput": total_ops / max(r["elapsed"] for r in results),
        "wall": wall,
        "latency": {
            k: (statistics.median(v), sorted(v)[max(0, int(len(v) * 0.95) - 1)])
            for k, v in merged.items()
            if v
        },
        "queries": {a: sum(r["queries"][a] for r in results) for a in ("primary", "replica")},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=("primary", "replica"))
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.ops, args.seed)))
        return
    if args.load:
        load(args.sessions, args.messages)
        return

    from tests.replica import StreamingPair

    pair = StreamingPair(Path(tempfile.mkdtemp(prefix="memory-replica-bench-")))
    try:
        pair.start()
        env = {
            **os.environ,
            "DATABASE_URL": pair.primary_url,
            "REPLICA_DATABASE_URL": pair.replica_url,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "MEMORY_APP_JSON": "{}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        for name in ("CELERY_BROKER_URL", "REDIS_URL", "DB_TRANSACTION_POOLER"):
            env.pop(name, None)
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--load",
                "--sessions",
                str(args.sessions),
                "--messages",
                str(args.messages),
            ],
            cwd=ROOT,
            env=env,
            check=True,
        )
        target = pair.primary_sql("SELECT pg_current_wal_lsn()")
        while pair.replica_sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn") != "t":
            time.sleep(0.05)
        for mode in ("primary", "replica"):  # warm both servers' caches; not reported
            run_mode(env, mode, args.workers, max(10, args.ops // 10), 99)
        runs = [
            run_mode(env, mode, args.workers, args.ops, r)
            for r in range(args.rounds)
            for mode in ("primary", "replica")
        ]
    finally:
        pair.stop()

    lines = [
        "# One primary vs primary + hot standby (read-heavy mix)",
        "",
        f"`python bench/replica_bench.py --workers {args.workers} --ops {args.ops} --rounds {args.rounds}` — "
        f"{args.sessions} sessions x {args.messages} messages of one owner; {args.workers} worker "
        f"processes x {args.ops} operations (45% owner-scope search, 25% admin list, 25% window, "
        "5% append); both servers on this machine's cores, loopback TCP; after one warm-up round per mode.",
        "",
        "| mode | round | ops/s | owner search p50/p95 ms | admin list p50/p95 | window p50/p95 | append p50/p95 | queries primary / replica |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for index, run in enumerate(runs):
        lat = run["latency"]
        cells = [f"{lat[k][0]:.1f} / {lat[k][1]:.1f}" if k in lat else "-" for k in KINDS]
        lines.append(
            f"| {run['mode']} | {index // 2 + 1} | {run['throughput']:.0f} | "
            + " | ".join(cells)
            + f" | {run['queries']['primary']} / {run['queries']['replica']} |"
        )
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replica.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
