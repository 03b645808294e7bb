"""What follows an append: the after-append job indexes new messages for recall (full text,
vectors) off the request path, once per session at a time, and nothing is lost when the job
never runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from io import StringIO

import pytest
import redis
from django.core.management import call_command

from memory_app import Memory
from memory_app.models import Embedding, Message
from memory_app.providers.embeddings import LexicalEmbedder
from memory_app.services import background, retention
from tests.celery_worker import wait_until
from tests.short_script import PoolEmbedder

from .conftest import ROOT, celery_publishing_to, database_url_for_subprocess

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BROKER = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def pending(mem) -> list[int]:
    return list(
        Message.objects.filter(session_id=mem.id, index_pending=True)
        .order_by("seq")
        .values_list("seq", flat=True)
    )


def indexed(mem) -> list[int]:
    """Cursors whose full-text vector and embedding are both stored."""
    vectors = set(Embedding.objects.filter(session_id=mem.id).values_list("cursor", flat=True))
    return [
        seq
        for seq in Message.objects.filter(session_id=mem.id, search_vector__isnull=False)
        .order_by("seq")
        .values_list("seq", flat=True)
        if seq in vectors
    ]


class ThreadRecordingEmbedder(LexicalEmbedder):
    """The lexical embedder, noting which thread embeds and how many texts per call."""

    calls: list[tuple[str, int]] = []

    def embed(self, texts):
        ThreadRecordingEmbedder.calls.append((threading.current_thread().name, len(texts)))
        return super().embed(texts)


def test_without_a_broker_the_job_runs_after_the_append_in_a_background_thread(settings):
    settings.MEMORY_APP = {
        "AFTER_APPEND": "deferred",
        "EMBEDDER": f"{__name__}.ThreadRecordingEmbedder",
        "IMPORTANCE_THRESHOLD": None,
    }
    ThreadRecordingEmbedder.calls.clear()
    mem = Memory.session("deferred", owner=None)
    stored = mem.add_many([{"role": "user", "content": f"fact {i} about tulips"} for i in range(5)])
    assert [m.cursor for m in stored] == [1, 2, 3, 4, 5]
    assert background.wait_for_deferred(timeout=30)
    assert indexed(mem) == [1, 2, 3, 4, 5] and pending(mem) == []
    # Embedded off the caller's thread, the whole batch in one call.
    assert ThreadRecordingEmbedder.calls == [("memory_app-after-append", 5)]
    assert [r.cursor for r in mem.search("tulips", mode="fulltext", limit=5)] != []


def test_the_thread_lets_appends_gather_and_handles_them_in_one_job(settings):
    settings.MEMORY_APP = {
        "AFTER_APPEND": "deferred",
        "AFTER_APPEND_DELAY_MS": 5000,  # longer than the appends below take
        "EMBEDDER": f"{__name__}.ThreadRecordingEmbedder",
        "IMPORTANCE_THRESHOLD": None,
    }
    ThreadRecordingEmbedder.calls.clear()
    mem = Memory.session("gathered", owner=None)
    for i in range(10):
        mem.add({"role": "user", "content": f"fact {i} about dahlias"})
    assert pending(mem) == list(range(1, 11))  # still gathering
    assert background.wait_for_deferred(timeout=30)  # a drain handles what waits at once
    assert ThreadRecordingEmbedder.calls == [("memory_app-after-append", 10)]
    assert indexed(mem) == list(range(1, 11))


def test_what_gathers_is_handled_when_the_delay_is_up(settings):
    settings.MEMORY_APP = {
        "AFTER_APPEND": "deferred",
        "AFTER_APPEND_DELAY_MS": 50,
        "IMPORTANCE_THRESHOLD": None,
    }
    mem = Memory.session("delayed", owner=None)
    mem.add({"role": "user", "content": "the tortoise is called Gerald"})
    # Nobody drains: the thread's own timer hands the session on.
    wait_until(lambda: pending(mem) == [], timeout=30, message="the gathered job")
    assert indexed(mem) == [1]


def test_a_drained_background_thread_holds_no_connection(settings):
    """Once ``wait_for_deferred`` returns, the thread has closed its database connection: a
    test database dropped next, or a process about to exit, finds nobody still on it."""
    from django.db.backends.signals import connection_created

    settings.MEMORY_APP = {"AFTER_APPEND": "deferred", "IMPORTANCE_THRESHOLD": None}
    opened = []

    def note(sender, connection, **kwargs):
        if threading.current_thread().name == "memory_app-after-append":
            opened.append(connection)

    connection_created.connect(note, weak=False, dispatch_uid="test-runner-connection")
    try:
        mem = Memory.session("drained", owner=None)
        for round_ in range(20):
            mem.add({"role": "user", "content": f"round {round_}"})
            assert background.wait_for_deferred(timeout=30)
            assert opened and all(wrapper.connection is None for wrapper in opened), round_
    finally:
        connection_created.disconnect(dispatch_uid="test-runner-connection")
    assert pending(mem) == []


def test_bad_after_append_settings_fail_the_system_checks(settings):
    from django.core.checks import run_checks

    for bad in (
        {"AFTER_APPEND": "later"},
        {"AFTER_APPEND_DELAY_MS": -1},
        {"AFTER_APPEND_DEBOUNCE_MS": "5s"},
    ):
        settings.MEMORY_APP = bad
        assert "memory_app.E031" in {e.id for e in run_checks()}, bad
    settings.MEMORY_APP = {"AFTER_APPEND": "immediate", "AFTER_APPEND_DELAY_MS": 0}
    assert "memory_app.E031" not in {e.id for e in run_checks()}


def test_with_a_broker_a_burst_of_appends_queues_one_task_per_session(settings):
    settings.MEMORY_APP = {"IMPORTANCE_THRESHOLD": None}
    queue = f"memory-test-after-append-{os.getpid()}"
    client = redis.Redis.from_url(BROKER)
    mem = Memory.session("debounced", owner=None)
    other = Memory.session("debounced-other", owner=None)
    try:
        with celery_publishing_to(BROKER, task_default_queue=queue, task_routes=None):
            for i in range(10):
                mem.add({"role": "user", "content": f"message {i} about roses"})
            other.add({"role": "user", "content": "a message about lilies"})
            assert client.llen(queue) == 2  # one task per session for the burst
            # The task clears the key before it reads: an append from then on queues again.
            background.start_after_append(mem.id)
            mem.add({"role": "user", "content": "one more about roses"})
            assert client.llen(queue) == 3
    finally:
        client.delete(queue, background.after_append_key(mem.id))
        client.delete(background.after_append_key(other.id))
    # No worker ran: everything is still marked for the job, and nothing is missing from
    # full-text recall meanwhile (pending messages are matched by the same expression).
    assert pending(mem) == list(range(1, 12))
    assert len(mem.search("roses", mode="fulltext", limit=20)) == 11
    # The job, as the worker runs it: everything indexed, in one pass.
    assert background.run_after_append(mem.id) == 11
    assert pending(mem) == [] and indexed(mem) == list(range(1, 12))


def test_by_default_the_append_leaves_the_scheduling_to_a_background_thread(settings):
    settings.MEMORY_APP = {"AFTER_APPEND": "deferred", "IMPORTANCE_THRESHOLD": None}
    queue = f"memory-test-after-append-deferred-{os.getpid()}"
    client = redis.Redis.from_url(BROKER)
    mem = Memory.session("deferred-broker", owner=None)
    try:
        with celery_publishing_to(BROKER, task_default_queue=queue, task_routes=None):
            for i in range(20):
                mem.add({"role": "user", "content": f"message {i} about peonies"})
            assert background.wait_for_deferred(timeout=30)
            assert client.llen(queue) == 1  # twenty appends, one task
            assert client.exists(background.after_append_key(mem.id))
    finally:
        client.delete(queue, background.after_append_key(mem.id))
    assert pending(mem) == list(range(1, 21))  # for the worker that would run it


def test_a_forked_child_starts_its_own_background_thread(settings):
    """A worker forked from a process that appended (gunicorn's, Celery's prefork) does not
    hand sessions to a thread it did not inherit."""
    settings.MEMORY_APP = {"EMBED_ON_APPEND": False}
    Memory.session("before-fork", owner=None).add({"role": "user", "content": "hello"})
    parent = background._deferred()
    assert parent.thread.is_alive()
    pid = os.fork()
    if pid == 0:  # the child: no database, no test framework; the answer is the exit code
        try:
            child = background._deferred()
            ok = child is not parent and child.pid == os.getpid() and child.thread.is_alive()
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert background._deferred() is parent  # the parent keeps its own


def test_a_crash_between_the_commit_and_the_scheduling_loses_nothing():
    mem = Memory.session("crashed", owner=None)
    texts = ["the boiler was serviced in March", "the plumber's name is Ada", "ok"]
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "CELERY_BROKER_URL": BROKER,
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.crash_appender", str(mem.id), *texts],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 9, done.stderr  # died after the commit, before scheduling
    assert [m.content for m in mem.messages()] == texts  # committed
    assert pending(mem) == [1, 2, 3] and indexed(mem) == []
    # Recall does not wait for the job: full text finds the committed messages already.
    assert [r.cursor for r in mem.search("plumber", mode="fulltext")] == [2]
    # Not stale yet: a live job may still come, so the periodic sweep leaves them a minute.
    assert retention.sweep_embeddings()["caught_up"] == 0
    swept = retention.sweep_embeddings(pending_older_than=0)
    assert swept["caught_up"] == 1
    assert pending(mem) == []
    assert indexed(mem) == [1, 2]  # "ok" is not worth a vector (SHOULD_RECALL)
    assert [r.cursor for r in mem.search("who fixed the boiler plumber", mode="vector")][:2] != []


def test_a_short_script_that_ends_at_once_still_gets_its_job_run():
    """The job runs as the interpreter starts to shut down, while libraries still work: an
    embedder that imports concurrent.futures' process module and uses a thread pool (as a local
    model does) used to fail there and leave the message for a sweep that may never run."""
    mem = Memory.session("short-script", owner=None)
    settings = {
        "EMBEDDER": "tests.short_script.PoolEmbedder",
        "AFTER_APPEND": "deferred",
        "AFTER_APPEND_DELAY_MS": 60_000,  # still gathering when the script ends
    }
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "MEMORY_APP_JSON": json.dumps(settings),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("CELERY_BROKER_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.short_script", str(mem.id), "the spare key is under the pot"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "left for the sweep" not in done.stderr and "failed" not in done.stderr, done.stderr
    assert pending(mem) == [] and indexed(mem) == [1]
    stored = Embedding.objects.get(session_id=mem.id, cursor=1)
    assert stored.model == PoolEmbedder().name


def test_memory_embed_picks_up_what_no_job_indexed():
    mem = Memory.session("never-run", owner=None)
    with celery_publishing_to("redis://127.0.0.1:9/0", broker_connection_retry=False):
        mem.add_many([{"role": "user", "content": f"note {i} on the garden"} for i in range(4)])
    assert pending(mem) == [1, 2, 3, 4]  # the broker was down: nothing scheduled
    out = StringIO()
    call_command("memory_embed", "--no-progress", stdout=out, stderr=StringIO())
    assert "1 sessions with messages awaiting indexing" in out.getvalue()
    assert pending(mem) == [] and indexed(mem) == [1, 2, 3, 4]


class CountingCondition(threading.Condition):
    """A condition that counts how often it is taken."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def __enter__(self):
        self.taken += 1
        return super().__enter__()


def test_appends_to_a_session_already_waiting_do_not_take_the_threads_lock(settings):
    settings.MEMORY_APP = {
        "AFTER_APPEND": "deferred",
        "AFTER_APPEND_DELAY_MS": 5000,  # the session waits while the appends below run
        "IMPORTANCE_THRESHOLD": None,
    }
    runner = background._deferred()
    assert background.wait_for_deferred(timeout=30)
    counting = CountingCondition()
    runner.condition, saved = counting, runner.condition
    try:
        mem = Memory.session("burst", owner=None)
        for i in range(20):
            mem.add({"role": "user", "content": f"fact {i} about irises"})
        # The first append hands the session over; the 19 after it find it waiting.
        assert counting.taken == 1
        assert pending(mem) == list(range(1, 21))
    finally:
        runner.condition = saved
        with counting:
            counting.notify_all()  # the thread may wait on the counting one: wake it
    assert background.wait_for_deferred(timeout=30)
    assert pending(mem) == [] and indexed(mem) == list(range(1, 21))


def test_messages_that_want_no_vector_are_indexed_in_one_statement(settings, monkeypatch):
    """Without ``EMBED_ON_APPEND`` only remembered messages are embedded: the others get their
    full-text vectors and lose the mark in one statement per batch, with no look-up first, and
    the remembered ones still go through the embedder."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memory_app.services import indexing

    settings.MEMORY_APP = {
        "AFTER_APPEND": "immediate",
        "EMBED_ON_APPEND": False,
        "IMPORTANCE_THRESHOLD": None,
        "SUMMARIZE_THRESHOLD_TOKENS": None,
        "EMBEDDER": "tests.recall.test_after_append.ThreadRecordingEmbedder",
    }
    mem = Memory.session("plain-then-remembered", owner=None)
    with monkeypatch.context() as patch:
        patch.setattr(background, "schedule_after_append", lambda session_id: None)
        for i in range(5):
            mem.add({"role": "user", "content": f"note {i} about tulips"})
    assert pending(mem) == [1, 2, 3, 4, 5]
    with CaptureQueriesContext(connection) as queries:
        assert background.run_after_append(mem.id) == 5
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert pending(mem) == []
    assert Message.objects.filter(session_id=mem.id, search_vector__isnull=True).count() == 0
    assert not Embedding.objects.filter(session_id=mem.id).exists()

    # Batches smaller than the backlog, and remembered messages among plain ones.
    monkeypatch.setattr(indexing, "PLAIN_BATCH", 2)
    with monkeypatch.context() as patch:
        patch.setattr(background, "schedule_after_append", lambda session_id: None)
        for i in range(5, 10):
            mem.add({"role": "user", "content": f"note {i} about tulips", "remember": i == 7})
    assert pending(mem) == [6, 7, 8, 9, 10]
    assert background.run_after_append(mem.id) == 5
    assert pending(mem) == []
    assert Message.objects.filter(session_id=mem.id, search_vector__isnull=True).count() == 0
    assert list(Embedding.objects.filter(session_id=mem.id).values_list("cursor", flat=True)) == [8]
