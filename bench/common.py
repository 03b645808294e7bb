"""What every benchmark shares: a ``bench`` database on the project's PostgreSQL server, timing
statistics, memory figures and markdown tables.

The benchmarks use the database the project itself is configured with (``DATABASE_URL``, or the
embedded PostgreSQL it starts) but a separate database on that server, named ``bench`` by
default, so benchmark data never mixes with the project's own.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def setup_django(
    db_name: str = "bench", *, fresh: bool = False, memory_app: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Point Django at database ``db_name`` on the project's server, create and migrate it.

    Returns the connection settings (Django's ``settings_dict``). ``fresh`` drops it first;
    ``memory_app`` overrides entries of the ``MEMORY_APP`` settings.
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.conf import settings

    database = settings.DATABASES["default"]  # reading settings starts the embedded server
    if memory_app:
        settings.MEMORY_APP = {**getattr(settings, "MEMORY_APP", {}), **memory_app}
    if database["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit("the benchmarks need PostgreSQL (set DATABASE_URL to a postgres:// URL)")
    if database["NAME"] != db_name:
        _create_database(database, db_name, fresh=fresh)
        database["NAME"] = db_name
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django.db import connection

    return connection.settings_dict


PLACEMENTS = ("any", "same", "apart")


def add_cpus_argument(parser) -> None:
    """The benchmarks' ``--cpus`` option (``cpu_placement``)."""
    parser.add_argument(
        "--cpus",
        choices=PLACEMENTS,
        default="any",
        help="this process and the database server where the OS puts them, on one CPU, or on "
        "two (Linux, a server on this machine)",
    )


def cpus_option(placement: str) -> str:
    """``--cpus`` as a results file's "Reproduce" line gives it: nothing when left to the OS."""
    return f" --cpus {placement}" if placement != "any" else ""


def results_suffix(options: str) -> str:
    """A results file name's suffix for command-line ``options`` (`` --cpus same`` gives
    ``-cpus-same``)."""
    return options.replace(" --", "-").replace(" ", "-")


@contextlib.contextmanager
def cpu_placement(settings_dict: dict[str, Any], placement: str) -> Iterator[str]:
    """Where this process and the database server run while the block runs (Linux, a server on
    this machine); yields a sentence that says so.

    ``"any"``: where the OS puts them, which can change from run to run. ``"same"``: all on one
    CPU, so each round trip switches processes on it and every microsecond of work, the
    client's and the server's, adds to the latency. ``"apart"``: this process on one CPU, the
    server on another, so each round trip waits for a wake-up across CPUs, as it would for a
    server on another machine. The server's processes (new ones included: they are forked from
    the postmaster) get their CPUs back when the block ends.
    """
    if placement == "any":
        yield "where the OS put them (not pinned)"
        return
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "apart" and len(cpus) < 2:
        raise SystemExit("--cpus apart needs two CPUs")
    client, server = {cpus[0]}, {cpus[0] if placement == "same" else cpus[1]}
    import psycopg

    with psycopg.connect(**libpq_params(settings_dict), autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        try:  # while the backend lives
            # A server elsewhere may have a backend whose number some process here has too.
            if b"postgres" not in Path(f"/proc/{backend}/cmdline").read_bytes():
                raise OSError
            postmaster = _parent(backend)
        except OSError:
            raise SystemExit("--cpus needs the database server on this machine") from None
    servers = [postmaster] + [pid for pid in _pids() if _parent(pid, default=0) == postmaster]
    threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    saved = {pid: os.sched_getaffinity(pid) for pid in servers + threads}
    try:
        for pid in servers:
            try:
                os.sched_setaffinity(pid, server)
            except ProcessLookupError:
                pass
            except PermissionError:
                raise SystemExit(
                    "--cpus needs to set the database server's CPUs: run as its user or as root"
                ) from None
        for tid in threads:  # threads started later inherit the CPU of the one starting them
            os.sched_setaffinity(tid, client)
        where = "one CPU" if placement == "same" else "two CPUs, one each"
        yield f"pinned to {where} (`--cpus {placement}`)"
    finally:
        for pid, affinity in saved.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(pid, affinity)
        for pid in _pids():  # forked meanwhile: given the postmaster's CPUs, now restored
            if _parent(pid, default=0) == postmaster:
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(pid, saved[postmaster])


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent(pid: int, default: int | None = None) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if default is None:
            raise
        return default
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name, in parentheses, may hold spaces


def _create_database(database: dict, name: str, *, fresh: bool) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(**libpq_params(database), autocommit=True) as conn:
        if fresh:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def libpq_params(settings_dict: dict) -> dict[str, Any]:
    """psycopg ``connect()`` keyword arguments for a Django database settings dict.

    The embedded server listens on a Unix socket only: its ``host`` is a directory.
    """
    options = dict(settings_dict.get("OPTIONS") or {})
    params = {
        "dbname": settings_dict.get("NAME") or "postgres",
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or options.pop("host", None),
        "port": settings_dict.get("PORT") or None,
    }
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        if key in options:
            params[key] = options[key]
    return {k: v for k, v in params.items() if v not in (None, "")}


def sqlalchemy_async_url(settings_dict: dict, driver: str = "asyncpg") -> str:
    """An async SQLAlchemy URL (``postgresql+asyncpg``) for the same server and database."""
    from sqlalchemy.engine import URL

    params = libpq_params(settings_dict)
    query = {}
    host = params.get("host")
    if host and host.startswith("/"):
        query["host"] = host  # a Unix socket directory goes in the query string
        host = None
    return URL.create(
        f"postgresql+{driver}",
        username=params.get("user"),
        password=params.get("password"),
        host=host,
        port=int(params["port"]) if params.get("port") else None,
        database=params["dbname"],
        query=query,
    ).render_as_string(hide_password=False)


# -- measuring ------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The sample at quantile ``q`` (0..1) of ``samples``, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@dataclass
class Latency:
    """Latencies of repeated single operations, in seconds."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)

    @property
    def count(self) -> int:
        return len(self.samples)


def warm_up(fn: Callable[[], Any], *, calls: int = 6, max_seconds: float = 0.5) -> None:
    """Run ``fn`` a few times untimed (caches, prepared statements); one call if it is slow."""
    deadline = time.perf_counter() + max_seconds
    for _ in range(calls):
        fn()
        if time.perf_counter() > deadline:
            return


def time_calls(
    fn: Callable[[], Any], *, count: int, max_seconds: float, warmup: int = 6, min_count: int = 3
) -> Latency:
    """Call ``fn`` up to ``count`` times, timing each; stop early after ``max_seconds`` once
    ``min_count`` calls are timed (one, for calls slower than a second)."""
    if warmup:
        warm_up(fn, calls=warmup)
    samples: list[float] = []
    deadline = time.perf_counter() + max_seconds
    while len(samples) < count:
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        samples.append(end - start)
        if end > deadline and (len(samples) >= min_count or samples[-1] > 1.0):
            break
    return Latency(samples)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    Read from /proc (``VmHWM``) where there is one: ``ru_maxrss`` carries the parent's peak
    over fork and exec, which would hide a child's own figure.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / (1024 * 1024)


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def fmt_rate(per_second: float) -> str:
    return f"{per_second:,.0f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
