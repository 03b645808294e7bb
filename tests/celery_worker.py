"""A real Celery worker in a subprocess, and this test process sending tasks to it.

The worker runs ``celery -A project worker --pool=prefork --concurrency=1`` (the default pool:
its main process acknowledges, a child runs the task) against the real Redis and the pytest
database. Redis is shared with other test runs, so everything this run puts there is its own: a
queue named ``memory-test-<uuid>`` and every kombu key under a ``memory-test-<uuid>:`` prefix
(unacknowledged-message bookkeeping included). A short visibility timeout makes a task whose
worker was killed come back within seconds.

Embedding and summarization are routed (``memory_app.tasks.route_task``) by the worker's
``MEMORY_APP["TASK_QUEUES"]``: to the run's one queue unless a test gives its own. Several workers
of one run (same ``run``) share its prefix and consume the queues each is given
(``consumes``), e.g. one for ``queue_for("embed")`` and one for ``queue_for("summarize")``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parent.parent

#: Seconds after which a task taken by a worker that died is handed out again.
VISIBILITY_TIMEOUT = 3


def database_url(settings_dict: dict[str, Any]) -> str:
    """A ``DATABASE_URL`` for the database Django is connected to (the pytest one)."""
    if "postgresql" not in settings_dict["ENGINE"]:
        raise RuntimeError("a worker subprocess needs a PostgreSQL test database")
    host = settings_dict.get("HOST") or (settings_dict.get("OPTIONS") or {}).get("host", "")
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    # A Unix socket directory is given as a percent-encoded host.
    name = quote(settings_dict["NAME"], safe="")
    return f"postgres://{credentials}{quote(host, safe='')}{port}/{name}"


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class CeleryWorker:
    """One worker at a time, restartable after ``kill()``; each start logs to its own file."""

    def __init__(
        self,
        *,
        database: dict[str, Any],
        memory_app: dict[str, Any],
        log_dir: Path,
        run: str | None = None,
        consumes: list[str] | None = None,
        name: str = "worker",
    ) -> None:
        run = run or uuid.uuid4().hex[:12]
        self.run = run
        self.name = name
        self.queue = f"memory-test-{run}"
        #: The queues this worker consumes (the run's default queue unless given).
        self.consumes = list(consumes or [self.queue])
        memory_app = {
            "TASK_QUEUES": {"embed": self.queue, "summarize": self.queue, "maintenance": None},
            **memory_app,
        }
        self.transport_options = {
            "global_keyprefix": f"memory-test-{run}:",
            "visibility_timeout": VISIBILITY_TIMEOUT,
            # Look for abandoned messages every second instead of every 100.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
        self.memory_app = memory_app
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": database_url(database),
            "CELERY_BROKER_URL": REDIS_URL,
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            "CELERY_BROKER_TRANSPORT_OPTIONS": json.dumps(self.transport_options),
            "MEMORY_APP_JSON": json.dumps(memory_app),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("REDIS_URL", None)
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.log_path: Path | None = None

    def queue_for(self, kind: str) -> str:
        """A queue of this run for one kind of task (``"embed"``, ``"summarize"``)."""
        return f"{self.queue}-{kind}"

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60.0) -> CeleryWorker:
        """Start a new worker process and wait until it consumes."""
        if self.alive:
            raise RuntimeError("a worker is already running")
        self.starts += 1
        self.log_path = self.log_dir / f"{self.name}-{self.starts}.log"
        log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "--pool=prefork",
                "--concurrency=1",
                "--loglevel=INFO",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                "-Q",
                ",".join(self.consumes),
                "-n",
                f"{self.queue}-{self.name}-{self.starts}@%h",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            wait_until(
                lambda: " ready." in self.log() or not self.alive, timeout, 0.1, "worker start"
            )
        except AssertionError:
            self.kill()
            raise
        if not self.alive:
            raise RuntimeError(f"the worker exited at start:\n{self.log()}")
        return self

    def ensure_running(self) -> CeleryWorker:
        return self if self.alive else self.start()

    def pool_processes(self) -> list[int]:
        """Pids of the worker's pool (child) processes."""
        found = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True
        )
        return [int(pid) for pid in found.stdout.split()]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no acknowledgement, exactly like a crashed machine."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    # -- observing ----------------------------------------------------------------------------
    def log(self) -> str:
        """The current worker's log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def all_logs(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob(f"{self.name}-*.log"))
        )

    def count(self, needle: str) -> int:
        """Lines containing ``needle`` in the logs of every worker started so far."""
        return sum(needle in line for line in self.all_logs().splitlines())

    def wait_for_log(self, needle: str, times: int = 1, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.count(needle) >= times,
            timeout,
            0.1,
            f"{needle!r} x{times} in the worker log:\n{self.all_logs()[-3000:]}",
        )

    # -- this process as the producer -----------------------------------------------------------
    @contextmanager
    def sending(self, broker_url: str | None = None) -> Iterator[None]:
        """Make this (normally eager) test process send tasks to the worker's queue.

        ``broker_url`` points the producer elsewhere, e.g. at a closed port to play Redis down.
        """
        from celery import current_app as app

        keys = (
            "broker_url",
            "task_always_eager",
            "task_default_queue",
            "broker_transport_options",
            "task_routes",
        )
        saved = {key: app.conf[key] for key in keys}
        app.conf.update(
            broker_url=broker_url or REDIS_URL,
            task_always_eager=False,
            task_default_queue=self.queue,
            broker_transport_options=self.transport_options,
            task_routes=["memory_app.tasks.route_task"],  # by this process's TASK_QUEUES
        )
        _reset_producer(app)
        try:
            yield
        finally:
            app.conf.update(saved)
            _reset_producer(app)

    def purge(self) -> None:
        """Drop everything this run put in Redis (queue, unacknowledged messages, bindings)."""
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{self.transport_options['global_keyprefix']}*"))
        if keys:
            client.delete(*keys)
        client.close()


def _reset_producer(app) -> None:
    """Forget broker connections and routing built from the previous configuration."""
    from kombu import pools

    app._pool = None
    pools.reset()  # kombu shares pools per broker URL: close them and forget them
    app.__dict__.pop("amqp", None)
