"""Fixtures shared by the whole suite."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from django.conf import settings
from django.db import connection

from memory_app import conf

# The suite's embedder is the lexical one, fast and deterministic, whatever extras are installed
# here: the default ("auto") would pick the local model where [local-embeddings] is. Tests that
# set MEMORY_APP replace the whole dict, so the default itself is pinned for this process, and
# processes the tests start (workers, servers, appenders) get it through MEMORY_APP_JSON.
# tests/recall/test_auto_embedder.py sets EMBEDDER="auto" explicitly.
# Without a broker the after-append job runs right after the commit, in the caller's thread, so
# tests read its results when add() returns; tests/store/test_after_append.py covers the
# deferred default.
conf.DEFAULTS["EMBEDDER"] = conf.LEXICAL_EMBEDDER
conf.DEFAULTS["AFTER_APPEND"] = "immediate"
_pinned = {"EMBEDDER": conf.LEXICAL_EMBEDDER, "AFTER_APPEND": "immediate"}
# The run through PgBouncer 1.18 in transaction mode prepares nothing, as a project behind it
# must (project/settings.py); pinned here too because tests that set MEMORY_APP replace it.
if os.environ.get("DB_TRANSACTION_POOLER") == "1":
    conf.DEFAULTS["PREPARE_STATEMENTS"] = _pinned["PREPARE_STATEMENTS"] = False
os.environ.setdefault("MEMORY_APP_JSON", json.dumps(_pinned))


# Users are made by the hundred: a fast hasher instead of PBKDF2's million rounds (each
# create_user took half a second on Django 6.1). Not a setting of the project: tests only.
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_collection_modifyitems(config, items):
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason=f"needs PostgreSQL + pgvector (database is {connection.vendor})")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def make_user(django_user_model):
    def make(username: str | None = None, **extra):
        return django_user_model.objects.create_user(
            username=username or f"user-{uuid.uuid4().hex[:8]}", password="pw", **extra
        )

    return make


@pytest.fixture
def user(make_user):
    return make_user("alice")


@pytest.fixture
def other_user(make_user):
    return make_user("bob")


@pytest.fixture
def mem(db, user):
    from memory_app import Memory

    return Memory.session("test-session", owner=user, namespace="tests")


def tool_turn(
    call_id: str = "call_1", *, result: str = "sunny", name: str = "weather"
) -> list[dict]:
    """An assistant tool call and its result, as a model would produce them."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


@pytest.fixture(scope="session")
def _openai_server():
    from tests.openai_server import FakeOpenAIServer

    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def openai_server(_openai_server):
    """An OpenAI-compatible server on 127.0.0.1 (chat completions, embeddings), reset per test."""
    _openai_server.reset()
    yield _openai_server
    _openai_server.reset()


def database_url() -> str:
    """A DATABASE_URL for the database this test process uses (the test database), so
    subprocesses (workers, concurrent appenders) connect to the same data."""
    from urllib.parse import quote

    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = quote(s["USER"] or "")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    host = s.get("HOST") or ""
    if host.startswith("/"):  # a Unix socket directory
        return f"postgresql://{auth}@/{s['NAME']}?host={quote(host)}"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgresql://{auth}@{host}{port}/{s['NAME']}"


# ---- a real Celery worker (tasks through Redis) ------------------------------------------------
@pytest.fixture(scope="session")
def _celery_worker(tmp_path_factory, django_db_setup, _openai_server):
    """One worker subprocess for the run (restarted by tests that kill it)."""
    from tests.celery_worker import CeleryWorker

    if connection.vendor != "postgresql":
        pytest.skip("a worker subprocess needs a PostgreSQL test database")
    worker = CeleryWorker(
        database=connection.settings_dict,
        # The worker's MEMORY_APP; tests sending to it use the same settings.
        memory_app={
            "EMBEDDER": conf.LEXICAL_EMBEDDER,
            "OPENAI": {
                "base_url": _openai_server.base_url,
                "api_key": "test",
                "max_retries": 0,
                "timeout": 20,
            },
            "SUMMARIZER": "memory_app.providers.summarizers.OpenAISummarizer",
            "SUMMARIZER_OPTIONS": {"model": "test-summarizer", "max_tokens": 200},
            "SUMMARIZE_KEEP_RECENT": 2,
            "SUMMARIZE_MAX_INPUT_TOKENS": 100,
            "SUMMARIZE_THRESHOLD_TOKENS": None,
            # Learns only from remembered messages of owned sessions: no model call.
            "MEMORY_EXTRACTOR": "memory_app.providers.extractors.OfflineExtractor",
        },
        log_dir=tmp_path_factory.mktemp("celery-worker"),
    )
    yield worker
    worker.stop()
    worker.purge()


@pytest.fixture
def celery_worker(_celery_worker, transactional_db, settings, openai_server):
    """A running worker, with this process sending tasks to it and sharing its MEMORY_APP.

    Tests using it need committed data: ``django_db(transaction=True)`` (requested here).
    """
    settings.MEMORY_APP = dict(_celery_worker.memory_app)
    _celery_worker.ensure_running()
    with _celery_worker.sending():
        yield _celery_worker
