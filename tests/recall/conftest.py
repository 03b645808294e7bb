"""Fixtures of the recall tests: conversations to search, embedder settings, a real worker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from memory_app import Memory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def memory_settings_override():
    """``override(**MEMORY_APP)`` for the rest of the test (settings reload at once)."""
    stack = []

    def override(**values):
        manager = override_settings(MEMORY_APP=values)
        manager.enable()
        stack.append(manager)

    yield override
    for manager in reversed(stack):
        manager.disable()


@pytest.fixture
def openai_embedder(openai_server, memory_settings_override):
    """The configured embedder is OpenAIEmbedder, talking to the test server (no SDK retries:
    retrying is the task's job)."""
    memory_settings_override(
        EMBEDDER="memory_app.providers.embeddings.OpenAIEmbedder",
        EMBEDDER_OPTIONS={"model": "test-embed", "dimensions": 64, "batch_size": 4},
        OPENAI={"base_url": openai_server.base_url, "api_key": "test", "max_retries": 0},
    )
    return openai_server


@pytest.fixture
def embedded(django_capture_on_commit_callbacks):
    """Append and run what the append schedules after its commit (indexing for recall), as a
    worker would."""

    def append(mem, texts, **extra):
        with django_capture_on_commit_callbacks(execute=True):
            return add_turns(mem, texts, **extra)

    return append


def add_turns(mem, texts, role="user", **extra):
    return mem.add_many([{"role": role, "content": t, **extra} for t in texts])


@pytest.fixture
def garden_chat(db, user, django_capture_on_commit_callbacks):
    """A session of ``user`` about several topics, embedded (on-commit callbacks run)."""
    mem = Memory.session("garden", owner=user, namespace="tests")
    with django_capture_on_commit_callbacks(execute=True):
        add_turns(
            mem,
            [
                "I planted tomatoes and basil in the raised bed last spring.",
                "My dog Biscuit is a golden retriever who loves the beach.",
                "The quarterly report is due on the fifteenth of March.",
                "We repainted the kitchen a pale sage green.",
                "For dinner I cooked a mushroom risotto with parmesan.",
                "Our trip to Lisbon is booked for late September.",
            ],
        )
    return mem


# ---- a real Celery worker -----------------------------------------------------------------------


def database_url_for_subprocess() -> str:
    """A DATABASE_URL reaching the database this test process uses (pytest's test database)."""
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        return f"sqlite:///{s['NAME']}"
    user = urllib.parse.quote(s.get("USER") or "")
    password = urllib.parse.quote(s.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    # The embedded server's URI gives its socket folder as a "host" option.
    host = s.get("HOST") or (s.get("OPTIONS") or {}).get("host") or ""
    # A Unix socket folder is given percent-encoded in the host part.
    host = urllib.parse.quote(host, safe="") if host.startswith("/") else host
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{s['NAME']}"


def _drop_connections(app) -> None:
    # Forget (without closing: kombu's global pool registry may share them) the pools made
    # for the previous broker, so the next publish connects to the configured one.
    app._pool = None
    app.amqp._producer_pool = None


@contextlib.contextmanager
def celery_publishing_to(broker: str, **conf):
    """Make this process's Celery app publish to ``broker`` (not run tasks eagerly) for a while."""
    from celery import current_app

    app = current_app._get_current_object()
    values = {"broker_url": broker, "task_always_eager": False, **conf}
    saved = {k: app.conf[k] for k in values}
    _drop_connections(app)  # pools made for the old broker would be reused otherwise
    app.conf.update(values)
    try:
        yield app
    finally:
        _drop_connections(app)
        app.conf.update(saved)


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path):
    """Start ``celery -A project worker`` on Redis with a queue unique to this test, and point
    this process's Celery app at it. Yields the queue name; the worker is stopped at the end."""
    broker = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    queue = f"memory-test-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "CELERY_BROKER_URL": broker,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "DATABASE_URL": database_url_for_subprocess(),
        "PYTHONPATH": str(ROOT),
    }
    log = open(tmp_path / "worker.log", "w+")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "project",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{queue}@%h",
            "--loglevel=INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with celery_publishing_to(broker, task_default_queue=queue) as app:
            _wait_for_worker(app, queue, proc)
            yield queue
            with app.connection_for_write() as conn:
                conn.default_channel.queue_delete(queue)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        print("---- celery worker log ----\n" + log.read())  # shown when the test fails
        log.close()


def _wait_for_worker(app, queue, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("celery worker exited early (see its log below)")
        replies = app.control.ping(destination=[f"{queue}@{os.uname().nodename}"], timeout=1.0)
        if replies:
            return
    raise RuntimeError("celery worker did not start in time")
