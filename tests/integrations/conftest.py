"""Helpers for the integration tests: real framework objects, a real second process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from django.db import connection, transaction

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """A URL for the database this test runs on, so another process can open it.

    The embedded PostgreSQL listens on a Unix socket whose folder is in ``OPTIONS["host"]``;
    connection options travel as query parameters, which is where dj-database-url reads them.
    """
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(s["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            pytest.skip("the test database lives in memory: another process cannot open it")
        return f"sqlite:///{name}"
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = quote(s["HOST"] or "", safe="")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    options = {k: v for k, v in (s.get("OPTIONS") or {}).items() if isinstance(v, str | int)}
    query = f"?{urlencode(options)}" if options else ""
    return f"postgres://{auth}@{host}{port}/{quote(s['NAME'], safe='')}{query}"


def run_example(
    script: str, *args: str, openai_server, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``examples/<script>`` in a new Python process against this test's database and server."""
    # No broker: background tasks run eagerly in that process instead of going to a shared queue.
    inherited = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")}
    env = {
        **inherited,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "OPENAI_BASE_URL": openai_server.base_url,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_MODEL": "fake-model",
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result


# ---- a write in flight, for cancellation tests -------------------------------------------------
class RowLock:
    """Another PostgreSQL connection holds a memory session's row lock, as a concurrent writer.

    Every write of a session (append, pop, clear) takes that lock, so it waits until
    ``let_it`` lets the holder commit (``succeed=True``) or delete the session first.
    Tests using it need committed data: ``django_db(transaction=True)``.
    """

    def __init__(self, session_id) -> None:
        self.pk = session_id
        self.held, self.writer_waits, self.go = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )
        self.fail = False
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        from memory_app.models import Session  # (``connection`` is this thread's own)

        try:
            with transaction.atomic():
                list(Session.objects.select_for_update().filter(pk=self.pk))
                self.held.set()
                deadline = time.monotonic() + 10
                with connection.cursor() as cursor:
                    while not self.writer_waits.is_set() and time.monotonic() < deadline:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND datname = current_database() AND pid <> pg_backend_pid()"
                        )
                        if cursor.fetchone()[0]:
                            self.writer_waits.set()
                        time.sleep(0.01)
                self.go.wait(30)
                if self.fail:  # the write's outcome: it fails, nothing of it is stored
                    Session.objects.filter(pk=self.pk).delete()
        finally:
            connection.close()

    def __enter__(self) -> RowLock:
        self.thread.start()
        assert self.held.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.go.set()
        self.thread.join(10)

    async def wait_until_the_write_waits(self) -> None:
        assert await asyncio.to_thread(self.writer_waits.wait, 10), (
            "the write never reached the lock"
        )

    async def let_it(self, task: asyncio.Future, *, succeed: bool) -> None:
        self.fail = not succeed
        self.go.set()


async def settle() -> None:
    """Let the event loop run everything that is ready: a cancellation is delivered within a
    loop iteration or two, so a task still pending after this waits on something outside the
    loop (its write, in a thread). No fixed sleep: nothing here depends on the machine's speed."""
    for _ in range(20):
        await asyncio.sleep(0)


async def cancel_in_flight(operation, lock, *, succeed: bool = True) -> bool:
    """Start ``operation``, cancel it while its write waits for the lock, then let the write end.

    Returns whether the task was still pending after the cancel (before the write could end);
    the task must then raise ``CancelledError``.
    """
    with lock:
        task = asyncio.ensure_future(operation())
        await lock.wait_until_the_write_waits()
        task.cancel()
        await settle()
        pending = not task.done()
        await lock.let_it(task, succeed=succeed)
        with pytest.raises(asyncio.CancelledError):
            await task
    return pending
