"""Our append endpoint against the floor: a minimal DRF view, same server, same auth, one run.

    python bench/api_floor.py                # 2 rounds of 10 s per endpoint and configuration
    python bench/api_floor.py --seconds 20 --rounds 3

gunicorn (2 gthread workers x 8 threads, the project's settings plus one endpoint:
``bench/floor_settings.py``, ``bench/floor_site.py``) serves both ``POST /api/memory/sessions/{id}/messages/`` and the floor,
``POST /floor/messages/``: a DRF ``APIView`` with the same ``TokenAuthentication`` that does one
INSERT. ``wrk`` (a C load generator, so the generator does not take the CPU the server needs)
sends one plain user message per request with 32 connections, cycling through 32 users, each
with a token and a session of its own. The endpoints take turns, ``--rounds`` times, so load
from elsewhere on the machine falls on both alike; requests/s and p99 are summed and taken
over the rounds.

Configurations (each its own server):

- ``production``: the default ``MEMORY_APP`` with a Redis broker configured (a database of the
  benchmark's own, emptied afterwards) and no worker: each append scores importance and
  schedules its after-append job, as in production.
- ``store alone``: no broker, no embedding, no summarize trigger (the after-append job only
  fills the full-text vectors, in the server's background thread).

Afterwards every session's cursors must be exactly 1..N with its counters matching the rows,
and no response may be an error. Writes ``bench/results/api_floor.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_load import recreate, server_url  # noqa: E402
from tests.live_api import Gunicorn, LiveDatabase  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DATABASE = "memory_api_floor"
BROKER = "redis://127.0.0.1:6379/15"
CONNECTIONS = 32
CONTENT = (
    "Could you check whether the replacement part fits model seven, and tell me when the "
    "delivery to Oslo is expected? The tracking page has not changed since Tuesday."
)
CONFIGS = {
    "production": {"CELERY_BROKER_URL": BROKER, "MEMORY_APP_JSON": "{}"},
    "store alone": {
        "CELERY_BROKER_URL": "",
        "MEMORY_APP_JSON": json.dumps(
            {
                "EMBED_ON_APPEND": False,
                "SUMMARIZE_THRESHOLD_TOKENS": None,
                "IMPORTANCE_THRESHOLD": None,
            }
        ),
    },
}


def lua_script(clients, path_of) -> str:
    """A wrk script: each request goes to the next client (token, path), in turn."""
    rows = ",\n".join(f'  {{"Token {c.token}", "{path_of(c)}"}}' for c in clients)
    body = json.dumps({"role": "user", "content": CONTENT})
    return f"""
local clients = {{
{rows}
}}
local body = [[{body}]]
local i = 0
request = function()
  i = i + 1
  local c = clients[(i % #clients) + 1]
  return wrk.format("POST", c[2], {{["Authorization"] = c[1],
    ["Content-Type"] = "application/json"}}, body)
end
"""


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * _UNITS[unit]


def run_wrk(base_url: str, script: Path, seconds: int) -> dict:
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{CONNECTIONS}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            base_url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    elapsed = float(re.search(r"requests in ([\d.]+)s", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "requests": requests,
        "seconds": elapsed,
        "p50": _ms(re.search(r"\s50%\s+(\S+)", out).group(1)),
        "p99": _ms(re.search(r"\s99%\s+(\S+)", out).group(1)),
        "errors": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1).strip() if socket_errors else "",
    }


def create_floor_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_floor_message (id bigserial PRIMARY KEY, "
            "user_id integer NOT NULL, role text NOT NULL, content text NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )


def check_cursors(db: LiveDatabase) -> tuple[int, bool]:
    """How many messages are stored, and whether every session's cursors are 1..N with
    counters that match."""
    stored = db.stored()
    counters = db.counters()
    ok = True
    for session_id, (next_seq, count) in counters.items():
        cursors = [seq for seq, _content, _key in stored.get(session_id, [])]
        ok &= cursors == list(range(1, len(cursors) + 1))
        ok &= next_seq == len(cursors) + 1 and count == len(cursors)
    return sum(len(v) for v in stored.values()), ok


def measure(config: str, seconds: int, rounds: int, workdir: Path) -> dict:
    url = server_url(DATABASE)
    recreate(url, DATABASE)
    db = LiveDatabase(url)
    clients = db.prepare(CONNECTIONS)
    create_floor_table(url)
    scripts = {
        "ours": workdir / "ours.lua",
        "floor": workdir / "floor.lua",
    }
    scripts["ours"].write_text(
        lua_script(clients, lambda c: f"/api/memory/sessions/{c.session_id}/messages/")
    )
    scripts["floor"].write_text(lua_script(clients, lambda c: "/floor/messages/"))
    server = Gunicorn(url, workers=2, threads=8, conn_max_age=60)
    server.env.update(CONFIGS[config])
    server.env["DJANGO_SETTINGS_MODULE"] = "bench.floor_settings"
    results: dict[str, list[dict]] = {"ours": [], "floor": []}
    with server:
        for name in ("floor", "ours"):  # warm-up: connections, prepared plans, imports
            run_wrk(server.base_url, scripts[name], 3)
        for r in range(rounds):
            order = ("floor", "ours") if r % 2 == 0 else ("ours", "floor")
            for name in order:
                results[name].append(run_wrk(server.base_url, scripts[name], seconds))
                print(f"  {config} {name}: {results[name][-1]}", file=sys.stderr)
    stored, cursors_ok = check_cursors(db)
    if config == "production":
        import redis

        redis.Redis.from_url(BROKER).flushdb()  # the tasks no worker ran
    recreate(url, DATABASE, drop_only=True)
    summary = {}
    for name, runs in results.items():
        summary[name] = {
            "rate": sum(r["requests"] for r in runs) / sum(r["seconds"] for r in runs),
            "p50": max(r["p50"] for r in runs),
            "p99": max(r["p99"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
            "socket_errors": "; ".join(r["socket_errors"] for r in runs if r["socket_errors"]),
        }
    summary["stored"] = stored
    summary["cursors_ok"] = cursors_ok
    return summary


def render(figures: dict, seconds: int, rounds: int, load: str, elapsed: float) -> str:
    rows = []
    for config, f in figures.items():
        ours, floor = f["ours"], f["floor"]
        rows.append(
            f"| {config} | {floor['rate']:,.0f} | {ours['rate']:,.0f} | "
            f"**{ours['rate'] / floor['rate']:.2f}x** | {floor['p99']:.1f} | {ours['p99']:.1f} | "
            f"**{ours['p99'] / floor['p99']:.2f}x** | {ours['errors'] + floor['errors']} | "
            f"{f['stored']:,}, {'cursors 1..N' if f['cursors_ok'] else 'CURSOR GAPS'} |"
        )
    return "\n".join(
        [
            "# Append endpoint against the floor (one server, one run)",
            "",
            "| configuration | floor req/s | ours req/s | ours / floor | floor p99 (ms) | "
            "ours p99 (ms) | p99 ours / floor | errors | our messages stored |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
            *rows,
            "",
            f"gunicorn 2 gthread workers x 8 threads (CONN_MAX_AGE=60, DEBUG off), wrk with "
            f"{CONNECTIONS} connections over 2 threads, one plain user message per request, "
            f"{CONNECTIONS} users each with a token and a session; the endpoints take turns, "
            f"{rounds} rounds of {seconds} s each (requests/s over all rounds, p99 the worst "
            f"round's). The floor is `bench/floor_site.py`: DRF `APIView`, `TokenAuthentication`, "
            f"one INSERT. *production*: default `MEMORY_APP`, Redis broker configured, no worker; "
            f"*store alone*: no broker, no embedding, no summarize trigger.",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores (server, wrk and PostgreSQL "
            f"share them), Python {platform.python_version()}; load average at start {load}; "
            f"the run took {elapsed:.0f} s.",
            "",
            f"Reproduce: `python bench/api_floor.py --seconds {seconds} --rounds {rounds}`",
            "",
        ]
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--output", type=Path, default=RESULTS / "api_floor.md")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("api_floor.py needs wrk on PATH (Debian: apt-get install -y wrk)")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    began = time.perf_counter()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="memory-api-floor-") as workdir:
        for config in args.configs.split(","):
            figures[config] = measure(config, args.seconds, args.rounds, Path(workdir))
    table = render(figures, args.seconds, args.rounds, load, time.perf_counter() - began)
    args.output.write_text(table)
    print(table)
    bad = [c for c, f in figures.items() if not f["cursors_ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
