"""The REST API under load: locust (headless) against gunicorn on 127.0.0.1, then a check that
every acknowledged message is stored.

    python bench/api_load.py              # 32 clients for 30 s
    python bench/api_load.py --full       # 32 clients for 120 s
    python bench/api_load.py --clients 64 --seconds 60 --workers 4 --threads 4

Each simulated client is a user with a token and a session of its own; it appends one message
(3 of every 4 requests) or reads a window of 2,000 tokens (1 of 4), with no think time, so the
server runs flat out. Throttling stays on (the default rates; each client stays far below them).
Background work (summarization, embedding) is off: in production it runs in Celery workers.

The server is the project's PostgreSQL (``DATABASE_URL``, or the embedded server the project
starts), on a database of its own (``memory_api_load``, created afresh and dropped at the end).
Afterwards every message acknowledged with a 201 must be stored at its cursor with its content,
cursors must be exactly 1..N in every session, and counters must match the rows.

Writes ``bench/results/api_load.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live_api import (  # noqa: E402
    Gunicorn,
    LiveDatabase,
    peak_rss_of_this_process_mb,
    verify,
    vm_hwm_mb,
)

RESULTS = ROOT / "bench" / "results"
DATABASE = "memory_api_load"


def server_url(database: str) -> str:
    """A libpq URL for ``database`` on the project's PostgreSQL server (started if embedded)."""
    from project.database import database_config

    config = database_config(ROOT)
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit("the API benchmark needs PostgreSQL (DATABASE_URL=postgresql://...)")
    auth = quote(config.get("USER") or "postgres")
    if config.get("PASSWORD"):
        auth += ":" + quote(config["PASSWORD"])
    host = config.get("HOST") or ""
    if host.startswith("/"):
        return f"postgresql://{auth}@/{database}?host={quote(host)}"
    port = f":{config['PORT']}" if config.get("PORT") else ""
    return f"postgresql://{auth}@{host}{port}/{database}"


def recreate(url: str, name: str, *, drop_only: bool = False) -> None:
    import psycopg
    from psycopg import sql

    admin = (
        url.replace(f"/{name}?", "/postgres?")
        if "?" in url
        else url.rsplit("/", 1)[0] + "/postgres"
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def run_locust(
    base_url: str,
    clients_file: Path,
    acks_file: Path,
    csv_prefix: Path,
    *,
    users: int,
    seconds: int,
) -> float:
    """Run locust headless; returns its peak RSS in MB (sampled while it runs)."""
    env = {**os.environ, "LOAD_CLIENTS": str(clients_file), "LOAD_ACKS": str(acks_file)}
    args = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "bench" / "locustfile_api.py"),
        "--headless",
        "--users",
        str(users),
        "--spawn-rate",
        str(users),
        "--run-time",
        f"{seconds}s",
        "--host",
        base_url,
        "--csv",
        str(csv_prefix),
        "--json-file",
        str(csv_prefix),  # (locust adds .json)
        "--only-summary",
        "--skip-log",
        "--stop-timeout",
        "10",
        "--loglevel",
        "WARNING",
        "--exit-code-on-error",
        "0",
    ]
    process = subprocess.Popen(args, cwd=ROOT, env=env)
    peak = 0.0
    while process.poll() is None:
        peak = max(peak, vm_hwm_mb(process.pid))
        time.sleep(0.5)
    if process.returncode != 0:
        raise SystemExit(f"locust exited with {process.returncode}")
    return peak


def read_stats(json_file: Path) -> dict[str, dict[str, float]]:
    """Requests, failures, requests/s and percentiles per request name and in all, from locust's
    final JSON stats (its response-time histogram)."""
    entries = json.loads(json_file.read_text())
    merged: dict[str, float] = {}
    for entry in entries:
        for ms, count in entry["response_times"].items():
            merged[ms] = merged.get(ms, 0) + count
    start = min(e["start_time"] for e in entries)
    end = max(e["last_request_timestamp"] or start for e in entries)
    everything = {
        "name": "Aggregated",
        "response_times": merged,
        "start_time": start,
        "last_request_timestamp": end,
        "num_requests": sum(e["num_requests"] for e in entries),
        "num_failures": sum(e["num_failures"] for e in entries),
        "max_response_time": max(e["max_response_time"] for e in entries),
    }
    stats = {}
    for entry in [*entries, everything]:
        histogram = sorted((float(ms), count) for ms, count in entry["response_times"].items())
        # Throughput over the whole run (every request name counted over the same time).
        stats[entry["name"]] = {
            "requests": entry["num_requests"],
            "failures": entry["num_failures"],
            "rps": entry["num_requests"] / max(end - start, 1e-9),
            "p50": _percentile(histogram, 0.50),
            "p99": _percentile(histogram, 0.99),
            "max": entry["max_response_time"],
        }
    return stats


def _percentile(histogram: list[tuple[float, int]], q: float) -> float:
    total = sum(count for _, count in histogram)
    seen = 0
    for ms, count in histogram:
        seen += count
        if seen >= q * total:
            return ms
    return histogram[-1][0] if histogram else 0.0


def read_failures(csv_prefix: Path) -> list[str]:
    path = Path(f"{csv_prefix}_failures.csv")
    if not path.exists():
        return []
    with open(path) as fh:
        return [
            f"{row['Name']}: {row['Error']} ×{row['Occurrences']}" for row in csv.DictReader(fh)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--full", action="store_true", help="run for 120 s")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="gunicorn workers")
    parser.add_argument(
        "--threads", type=int, default=8, help="threads per gunicorn worker (gthread)"
    )
    parser.add_argument("--out", default=str(RESULTS / "api_load.md"))
    args = parser.parse_args()
    seconds = 120 if args.full else args.seconds

    url = server_url(DATABASE)
    recreate(url, DATABASE)
    database = LiveDatabase(url)
    try:
        clients = database.prepare(users=args.clients)
        with tempfile.TemporaryDirectory(prefix="api-load-") as tmp:
            tmp = Path(tmp)
            clients_file, acks_file = tmp / "clients.json", tmp / "acks.json"
            clients_file.write_text(json.dumps([c.__dict__ for c in clients]))
            load_before = os.getloadavg()
            with Gunicorn(url, workers=args.workers, threads=args.threads, log_dir=tmp) as server:
                rss_sampler = _Sampler(server)
                locust_rss = run_locust(
                    server.base_url,
                    clients_file,
                    acks_file,
                    tmp / "locust",
                    users=args.clients,
                    seconds=seconds,
                )
                server_rss = rss_sampler.stop()
            stats = read_stats(tmp / "locust.json")
            failures = read_failures(tmp / "locust")
            acknowledged: dict[str, list] = {}
            for session_id, cursor, content in json.loads(acks_file.read_text()):
                acknowledged.setdefault(session_id, []).append((cursor, content, None))
        verdict = verify(database, acknowledged)
    finally:
        recreate(url, DATABASE, drop_only=True)

    report = render(args, seconds, stats, failures, verdict, server_rss, locust_rss, load_before)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    print(report)
    if not verdict.ok or stats["Aggregated"]["failures"]:
        raise SystemExit(1)


class _Sampler:
    """Samples the server's peak RSS while it runs (workers' peaks are lost when they exit)."""

    def __init__(self, server: Gunicorn) -> None:
        self.server, self.peak = server, {"master": 0.0, "worker_max": 0.0, "total": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            now = self.server.peak_rss_mb()
            self.peak = {k: max(self.peak[k], now[k]) for k in self.peak}

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        now = self.server.peak_rss_mb()
        return {k: max(self.peak[k], now[k]) for k in self.peak}


def render(args, seconds, stats, failures, verdict, server_rss, locust_rss, load_before) -> str:
    lines = [
        "# REST API under load",
        "",
        f"`python bench/api_load.py{' --full' if args.full else ''}`"
        f"{'' if args.clients == 32 else f' --clients {args.clients}'}: "
        f"{args.clients} locust clients (FastHttpUser, no think time; 3 appends : 1 window of 2,000 "
        f"tokens) for {seconds} s against gunicorn ({args.workers} gthread workers × {args.threads} "
        f"threads, persistent health-checked connections) on 127.0.0.1, embedded PostgreSQL 18 on a "
        f"Unix socket, all on one machine ({os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {load_before[0]:.1f} when it started).",
        "",
        "| requests | requests/s | errors | p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in ("append", "window", "Aggregated"):
        row = stats.get(name)
        if row:
            label = "all" if name == "Aggregated" else f"`{name}`"
            lines.append(
                f"| {label} ({row['requests']:,}) | {row['rps']:,.0f} | {row['failures']} | "
                f"{row['p50']:.0f} | {row['p99']:.0f} | {row['max']:.0f} |"
            )
    lines += [
        "",
        "| check after the run | result |",
        "| --- | --- |",
        f"| messages acknowledged (201) | {verdict.acknowledged:,} |",
        f"| of those stored at their cursor with their content | "
        f"{verdict.acknowledged - verdict.lost:,} (lost: {verdict.lost}) |",
        f"| sessions with cursors other than exactly 1..N | {verdict.gaps} |",
        f"| sessions whose counters disagree with their rows | {verdict.counter_mismatches} |",
        f"| stored but never acknowledged (in flight at the stop) | {verdict.unacknowledged_stored} |",
        "",
        "| peak RSS | MB |",
        "| --- | ---: |",
        f"| gunicorn master | {server_rss['master']:.0f} |",
        f"| largest gunicorn worker | {server_rss['worker_max']:.0f} |",
        f"| gunicorn, all processes | {server_rss['total']:.0f} |",
        f"| locust | {locust_rss:.0f} |",
        f"| this script (setup and check) | {peak_rss_of_this_process_mb():.0f} |",
        "",
        "Percentiles are locust's (response times kept to 1 ms below 100 ms, to 10 ms up to 1 s). Errors: "
        + ("none." if not failures else "; ".join(failures)),
        "",
    ]
    if verdict.problems:
        lines += ["Problems:", *[f"- {p}" for p in verdict.problems], ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
