"""PostgreSQL restarted again and again while the REST API is under load: what fails, for how
long, and what is lost (nothing).

    python bench/api_faults.py            # 32 clients, 3 restarts in about a minute
    python bench/api_faults.py --full     # 32 clients, 10 restarts
    python bench/api_faults.py --restarts 5 --every 10 --down 3

gunicorn serves the project against a PostgreSQL server of this run's own (a fresh data
directory, never the project's database), which is stopped (``pg_ctl stop -m fast``: open
transactions roll back, connections drop) and started again every ``--every`` seconds. The
clients are threads of this process rather than locust users, because each must retry the SAME
message (same idempotency key) until it is acknowledged, and each error must be timed against
the outages. Each client appends one message at a time and reads a window every fourth request.

The run is made twice: with the project's defaults (persistent connections checked before
reuse, ``CONN_HEALTH_CHECKS=1``) and without the check (``CONN_HEALTH_CHECKS=0``). Afterwards:
every acknowledged message is stored at its cursor with its content, cursors are exactly 1..N,
no idempotency key is stored twice, counters match the rows.

Writes ``bench/results/api_faults.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live_api import (  # noqa: E402
    Gunicorn,
    LiveDatabase,
    RetryStats,
    SeparatePostgres,
    attribute_errors,
    peak_rss_of_this_process_mb,
    restarts,
    retrying_clients,
    verify,
)

RESULTS = ROOT / "bench" / "results"
GRACE = 1.0  # seconds after the restart in which errors still count against the outage


def run_once(
    postgres: SeparatePostgres,
    *,
    name: str,
    clients: int,
    restart_count: int,
    every: float,
    down: float,
    health_checks: bool,
    workers: int,
    threads: int,
) -> dict:
    database = LiveDatabase(postgres.create_database(name))
    users = database.prepare(users=clients)
    with Gunicorn(
        database.url, workers=workers, threads=threads, health_checks=health_checks
    ) as server:
        stop, stats = threading.Event(), RetryStats()
        started = time.monotonic()
        pool = retrying_clients(server.base_url, users, stop=stop, stats=stats)
        with restarts(postgres, times=restart_count, every=every, down_for=down) as outages:
            pass
        time.sleep(every)  # service after the last outage
        stop.set()
        for thread in pool:
            thread.join(90)
        elapsed = time.monotonic() - started
        server_rss = server.peak_rss_mb()
    outside = attribute_errors(outages, stats.errors, grace=GRACE)
    verdict = verify(database, stats.acknowledged)
    recoveries = [r for r in (o.recovery(stats.acknowledged_at) for o in outages) if r is not None]
    return {
        "health_checks": health_checks,
        "elapsed": elapsed,
        "stats": stats,
        "outages": outages,
        "outside": outside,
        "verdict": verdict,
        "recoveries": recoveries,
        "server_rss": server_rss,
        "kinds": Counter(what for _, what in stats.errors),
        "stuck": sum(thread.is_alive() for thread in pool),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument(
        "--every", type=float, default=12.0, help="seconds of service between restarts"
    )
    parser.add_argument("--down", type=float, default=2.0, help="seconds the server stays down")
    parser.add_argument("--full", action="store_true", help="10 restarts")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--out", default=str(RESULTS / "api_faults.md"))
    args = parser.parse_args()
    restart_count = 10 if args.full else args.restarts

    load_before = os.getloadavg()
    postgres = SeparatePostgres()
    try:
        runs = [
            run_once(
                postgres,
                name=f"faults_{'checked' if checks else 'unchecked'}",
                clients=args.clients,
                restart_count=restart_count,
                every=args.every,
                down=args.down,
                health_checks=checks,
                workers=args.workers,
                threads=args.threads,
            )
            for checks in (True, False)
        ]
    finally:
        postgres.destroy()
    report = render(args, restart_count, runs, load_before)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    print(report)
    if any(not r["verdict"].ok or r["stuck"] for r in runs):
        raise SystemExit(1)


def render(args, restart_count: int, runs: list[dict], load_before) -> str:
    lines = [
        "# PostgreSQL restarted under REST API load",
        "",
        f"`python bench/api_faults.py{' --full' if args.full else ''}`: {args.clients} clients "
        f"(threads appending one message at a time with an idempotency key, retrying it every 50 ms "
        f"until acknowledged; a window every 4th request) against gunicorn ({args.workers} gthread workers "
        f"× {args.threads} threads, CONN_MAX_AGE=60) on 127.0.0.1. A PostgreSQL server of the run's "
        f"own was stopped (`pg_ctl stop -m fast`) {restart_count} times, {args.every:g} s apart, and "
        f"started again after {args.down:g} s. {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {load_before[0]:.1f} at the start.",
        "",
        "| connections | restarts | requests | errors during outages | errors in the 1 s after | "
        "errors at other times | kinds of error | back in service after | acknowledged | lost | "
        "stored twice | gaps |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        v, stats, outages = run["verdict"], run["stats"], run["outages"]
        during = sum(o.errors_during for o in outages)
        after = sum(o.errors_after for o in outages)
        kinds = ", ".join(f"{k} ×{n}" for k, n in run["kinds"].most_common()) or "none"
        rec = run["recoveries"]
        recovery = (
            f"median {statistics.median(rec) * 1000:.0f} ms, max {max(rec) * 1000:.0f} ms"
            if rec
            else "n/a"
        )
        label = "health-checked (default)" if run["health_checks"] else "unchecked"
        lines.append(
            f"| {label} | {len(outages)} | {stats.requests:,} | {during:,} | {after} | {run['outside']} | "
            f"{kinds} | {recovery} | {v.acknowledged:,} | {v.lost} | {v.duplicates} | {v.gaps} |"
        )
    lines += [
        "",
        "Per outage (health-checked run):",
        "",
        "| # | down for | errors during | errors in the second after | first append acknowledged after |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    checked = runs[0]
    for i, outage in enumerate(checked["outages"], 1):
        rec = outage.recovery(checked["stats"].acknowledged_at)
        lines.append(
            f"| {i} | {outage.started_at - outage.stopped_at:.1f} s | {outage.errors_during} | "
            f"{outage.errors_after} | {'n/a' if rec is None else f'{rec * 1000:.0f} ms'} |"
        )
    lines += [
        "",
        '"Back in service after": from the server accepting connections again to the first '
        "append acknowledged. "
        + (
            "Every error was answered `503 database_unavailable` with `Retry-After: 1` (none was a "
            "500). "
            if all(set(r["kinds"]) <= {"503"} for r in runs)
            else ""
        )
        + '"Acknowledged" counts messages answered 201, each '
        'then found stored at its cursor with its content. "Stored twice": an idempotency key '
        'stored more than once; "gaps": sessions whose cursors are not exactly 1..N (counters '
        "were checked against the rows too).",
        "",
        f"Peak RSS: gunicorn (all processes) {max(r['server_rss']['total'] for r in runs):.0f} MB, "
        f"largest worker {max(r['server_rss']['worker_max'] for r in runs):.0f} MB; this script "
        f"(the {args.clients} client threads and the checks) {peak_rss_of_this_process_mb():.0f} MB.",
        "",
    ]
    problems = [p for r in runs for p in r["verdict"].problems]
    if problems or any(r["stuck"] for r in runs):
        lines += [
            "Problems:",
            *[f"- {p}" for p in problems],
            *[
                f"- {r['stuck']} client(s) never got their message acknowledged"
                for r in runs
                if r["stuck"]
            ],
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
