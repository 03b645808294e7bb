"""Fixtures for the reliability tests: real appender processes against the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

APPENDER = Path(__file__).with_name("appender.py")
ROOT = Path(__file__).resolve().parents[2]


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL for the database Django is connected to (the test database).

    The embedded server listens on a Unix socket: its host is a directory, which goes in the
    query string (``?host=/path``), as libpq and dj-database-url read it.
    """
    options = dict(settings_dict.get("OPTIONS") or {})
    host = settings_dict.get("HOST") or ""
    if host.startswith("/"):
        options.setdefault("host", host)
        host = ""
    auth = quote(settings_dict.get("USER") or "", safe="")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(settings_dict["PASSWORD"], safe="")
    netloc = (auth + "@" if auth else "") + host
    if settings_dict.get("PORT"):
        netloc += f":{settings_dict['PORT']}"
    query = {k: v for k, v in options.items() if isinstance(v, (str, int))}
    url = f"postgres://{netloc}/{quote(settings_dict['NAME'], safe='')}"
    return url + ("?" + urlencode(query) if query else "")


@pytest.fixture
def run_appenders(transactional_db):
    """Run one appender process per plan on ``session_id``, all at once (see appender.py), and
    return what each one's steps returned."""
    from django.db import connection

    def run(session_id, plans: list[list[list[dict]]], timeout: float = 120) -> list[list]:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DJANGO_DEBUG": "0",
        }
        done = subprocess.run(
            [sys.executable, str(APPENDER), str(session_id)],
            input=json.dumps(plans),
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run
