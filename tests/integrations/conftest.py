"""Helpers for the integration tests: real framework objects, a real second process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from django.db import connection

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


def run_example(script: str, *args: str, openai_server, timeout: float = 120) -> subprocess.CompletedProcess:
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
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result
