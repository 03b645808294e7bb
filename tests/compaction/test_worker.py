"""summarize_session on a real Celery worker, through the real Redis, under at-least-once
delivery."""

from __future__ import annotations

import logging
import os
import signal
import uuid
from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django.db import connection

from memory_app import Memory
from memory_app.models import Message, Session, Snapshot
from memory_app.services.background import lock_key as _lock_key
from memory_app.tasks import summarize_session
from tests.celery_worker import REDIS_URL, VISIBILITY_TIMEOUT, CeleryWorker, wait_until

from .conftest import turns

pytestmark = [pytest.mark.celery, pytest.mark.postgres]

TASK = "memory_app.summarize_session"


def session_with(n: int, key: str | None = None):
    mem = Memory.session(key or f"worker-{uuid.uuid4().hex[:8]}", owner=None)
    mem.add_many(turns(n))
    return mem


def snapshot_count(mem) -> int:
    return Snapshot.objects.filter(session_id=mem.id).count()


def test_a_task_compacts_on_the_worker(celery_worker, openai_server):
    openai_server.reply_with("Six greetings.")
    mem = session_with(6)
    task_id = mem.summarize_async()
    celery_worker.wait_for_log(f"{TASK}[{task_id}] succeeded")
    snap = mem.latest_snapshot()
    assert (snap.version, snap.upto, snap.summary) == (1, 4, "Six greetings.")
    assert snap.metadata["idempotency_key"] == task_id


def test_a_duplicated_delivery_saves_one_snapshot(celery_worker, openai_server):
    mem = session_with(6)
    summarize_session.apply_async(args=[str(mem.id)], task_id="dup-" + str(mem.id))
    celery_worker.wait_for_log(f"[dup-{mem.id}] succeeded")
    assert snapshot_count(mem) == 1
    # New messages make more to cover, then the same message is delivered again.
    mem.add_many(turns(6, start=7))
    summarize_session.apply_async(args=[str(mem.id)], task_id="dup-" + str(mem.id))
    celery_worker.wait_for_log(f"[dup-{mem.id}] succeeded", times=2)
    assert snapshot_count(mem) == 1
    assert len(openai_server.requests_to("/chat/completions")) == 1  # the copy asked nobody
    # A different task does cover the new messages: the copy was harmless, not powerless.
    other = mem.summarize_async()
    celery_worker.wait_for_log(f"[{other}] succeeded")
    assert [s.upto for s in mem.snapshots()] == [4, 10]


def test_a_backlog_larger_than_one_run_is_covered_by_follow_up_runs(celery_worker, openai_server):
    mem = session_with(14)  # 12 to cover, 13 tokens each; a run takes at most 100 tokens
    task_id = mem.summarize_async()
    wait_until(lambda: snapshot_count(mem) == 2, message="the follow-up run")
    first, second = mem.snapshots()
    assert (first.upto, first.metadata["idempotency_key"], first.metadata["partial"]) == (
        7,
        task_id,
        True,
    )
    assert second.upto == 12 and second.metadata["idempotency_key"] != task_id
    # The follow-up updated the first summary with messages 8-12 only.
    second_request = openai_server.requests_to("/chat/completions")[1]["body"]["messages"][1][
        "content"
    ]
    assert f"Current summary:\n{first.summary}" in second_request
    assert (
        "msg-007" not in second_request
        and "msg-008" in second_request
        and "msg-013" not in second_request
    )


def test_a_provider_failure_is_retried_and_never_saved(celery_worker, openai_server):
    openai_server.fail_next(1, status=500)
    openai_server.reply_with("   ", "The real summary.")  # an empty answer first: an error too
    mem = session_with(5)
    task_id = mem.summarize_async()
    celery_worker.wait_for_log(f"[{task_id}] succeeded", timeout=30)
    assert [s.summary for s in mem.snapshots()] == ["The real summary."]
    assert len(openai_server.requests_to("/chat/completions")) == 3
    log = celery_worker.all_logs()
    assert log.count(f"[{task_id}] retry: Retry in") == 2
    assert "injected failure" in log and "EmptySummary" in log


def test_a_killed_worker_leaves_the_store_as_it_was_and_the_task_is_redelivered(
    celery_worker, openai_server
):
    mem = session_with(8)
    before = (mem.messages(), Session.objects.get(pk=mem.id).tokens_since_snapshot)
    openai_server.delay = 3  # the summarizer is slow: kill the worker while it waits
    task_id = mem.summarize_async()
    wait_until(
        lambda: openai_server.requests_to("/chat/completions"), message="the summarizer call"
    )
    celery_worker.kill()
    openai_server.delay = 0
    assert snapshot_count(mem) == 0
    assert (mem.messages(), Session.objects.get(pk=mem.id).tokens_since_snapshot) == before
    # A new worker gets the unacknowledged task once the visibility timeout has passed.
    celery_worker.start()
    celery_worker.wait_for_log(f"[{task_id}] succeeded", timeout=VISIBILITY_TIMEOUT + 20)
    assert celery_worker.count(f"[{task_id}] received") == 2
    assert snapshot_count(mem) == 1
    assert mem.latest_snapshot().upto == 6


def test_a_killed_pool_process_gets_its_task_requeued(celery_worker, openai_server):
    """Only the child running the task dies: the worker requeues it (reject_on_worker_lost)."""
    mem = session_with(8)
    openai_server.delay = 3
    task_id = mem.summarize_async()
    wait_until(
        lambda: openai_server.requests_to("/chat/completions"), message="the summarizer call"
    )
    [child] = celery_worker.pool_processes()
    os.kill(child, signal.SIGKILL)
    openai_server.delay = 0
    celery_worker.wait_for_log(f"[{task_id}] succeeded", timeout=20)
    assert "WorkerLostError" in celery_worker.log()
    assert celery_worker.count(f"[{task_id}] received") == 2
    assert [s.upto for s in mem.snapshots()] == [6]


@pytest.fixture
def threshold_worker(_celery_worker, transactional_db, settings, openai_server, tmp_path):
    """A worker of its own whose MEMORY_APP has a low summarize threshold: the after-append job
    checks the threshold on the worker, with the worker's settings (as it does in production,
    where web and workers share them)."""
    memory_app = {
        **{k: v for k, v in _celery_worker.memory_app.items() if k != "TASK_QUEUES"},
        "SUMMARIZE_THRESHOLD_TOKENS": 40,
        "EMBED_ON_APPEND": False,
        "IMPORTANCE_THRESHOLD": None,
    }
    worker = CeleryWorker(
        database=connection.settings_dict,
        memory_app=memory_app,
        log_dir=tmp_path,
        run=uuid.uuid4().hex[:12],
    )
    settings.MEMORY_APP = dict(worker.memory_app)
    worker.start()
    try:
        with worker.sending():
            yield worker
    finally:
        worker.stop()
        worker.purge()


def test_the_threshold_trigger_enqueues_at_most_once_per_session(threshold_worker, openai_server):
    worker = threshold_worker
    lock = redis.Redis.from_url(REDIS_URL)
    mem = Memory.session(f"trigger-{uuid.uuid4().hex[:8]}", owner=None)

    def summaries(state: str) -> list[str]:
        return [
            line.split("[", 2)[2].split("]", 1)[0]
            for line in worker.all_logs().splitlines()
            if f"Task {TASK}[" in line and f" {state}" in line
        ]

    openai_server.delay = 1.5  # the run lasts while we keep appending
    for message in turns(4):  # 4 x 12 tokens: over 40 at the 4th append
        mem.add(message)
    wait_until(lambda: openai_server.requests_to("/chat/completions"), message="the first run")
    first_task = lock.get(_lock_key(mem.id)).decode()
    for message in turns(6, start=5):  # over the threshold every time, while the run goes on
        mem.add(message)
    worker.wait_for_log(f"[{first_task}] succeeded")
    openai_server.delay = 0
    assert mem.snapshots()[-1].upto == 2  # the first run covered what was there when it began
    # Six appends over the threshold while it ran (their after-append jobs each checked it):
    # none queued a summary while the lock was held; once it was released, the session was
    # still over the threshold, so the next job queued the next run, once, and it covered the
    # rest but the two most recent. Seven appends over the threshold, two runs in all.
    wait_until(lambda: mem.latest_snapshot().upto == 8, message="the second run")
    wait_until(lambda: lock.get(_lock_key(mem.id)) is None, message="the lock to be released")
    assert len(summaries("received")) == len(set(summaries("received"))) == 2
    assert snapshot_count(mem) == 2
    # Every append was followed by its after-append job; bursts shared one task.
    wait_until(
        lambda: not Message.objects.filter(session_id=mem.id, index_pending=True).exists(),
        message="every message indexed",
    )
    assert 1 <= worker.count("Task memory_app.index_session[") // 2 <= 10  # received, succeeded


def test_redis_down_appends_still_work_and_the_sweep_catches_up(celery_worker, settings, caplog):
    settings.MEMORY_APP = {**celery_worker.memory_app, "SUMMARIZE_THRESHOLD_TOKENS": 40}
    mem = Memory.session(f"down-{uuid.uuid4().hex[:8]}", owner=None)
    with (
        celery_worker.sending(broker_url="redis://127.0.0.1:1/0"),
        caplog.at_level(logging.WARNING, logger="memory_app"),
    ):
        stored = mem.add_many(turns(8))
    assert [m.cursor for m in stored] == list(range(1, 9))
    assert "could not schedule the after-append job of session" in caplog.text
    assert snapshot_count(mem) == 0
    assert Message.objects.filter(session_id=mem.id, index_pending=True).count() == 8
    # Redis is back: the sweep enqueues what the appends could not.
    out = StringIO()
    call_command(
        "memory_summarize",
        "--over-threshold",
        "--namespace",
        mem.namespace,
        "--no-progress",
        stdout=out,
        stderr=StringIO(),
    )
    assert out.getvalue().startswith("1 enqueued")
    wait_until(lambda: snapshot_count(mem) == 1, message="the swept session's snapshot")
    assert mem.latest_snapshot().upto == 6
