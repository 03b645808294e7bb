"""Celery at scale: embedding and summarization on queues of their own, each drained by its own
real worker on Redis, so a backlog of one never holds up the other, and nothing is done twice."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from memory_app import Memory
from memory_app.models import Embedding, Message, Snapshot
from memory_app.services import background
from tests.celery_worker import CeleryWorker, wait_until
from tests.compaction.conftest import turns

pytestmark = [pytest.mark.celery, pytest.mark.postgres]

SUMMARIZE = "memory_app.summarize_session"
EMBED = ("memory_app.index_session", "memory_app.embed_session")


@pytest.fixture
def two_workers(django_db_setup, transactional_db, tmp_path, settings, openai_server):
    run = uuid.uuid4().hex[:12]
    queues = {
        "embed": f"memory-test-{run}-embed",
        "summarize": f"memory-test-{run}-summarize",
        "maintenance": None,
    }
    memory_app = {
        "OPENAI": {
            "base_url": openai_server.base_url,
            "api_key": "test",
            "max_retries": 0,
            "timeout": 20,
        },
        "SUMMARIZER": "memory_app.providers.summarizers.OpenAISummarizer",
        "SUMMARIZER_OPTIONS": {"model": "test-summarizer", "max_tokens": 200},
        "SUMMARIZE_KEEP_RECENT": 2,
        "SUMMARIZE_THRESHOLD_TOKENS": None,
        "IMPORTANCE_SCORER": None,
        "TASK_QUEUES": queues,
    }
    workers = [
        CeleryWorker(
            database=connection.settings_dict,
            memory_app=memory_app,
            log_dir=tmp_path,
            run=run,
            consumes=[queues[kind]],
            name=kind,
        )
        for kind in ("embed", "summarize")
    ]
    settings.MEMORY_APP = dict(workers[0].memory_app)
    try:
        yield workers
    finally:
        for worker in workers:
            worker.stop()
        workers[0].purge()  # one prefix for the run


def lines(worker: CeleryWorker, task: str, state: str) -> list[str]:
    return [
        line for line in worker.all_logs().splitlines() if f"Task {task}[" in line and state in line
    ]


def test_two_workers_on_their_own_queues_drain_a_mixed_backlog_once(two_workers, openai_server):
    embedder, summarizer = two_workers
    with embedder.sending():  # this process publishes to the run's queues by its TASK_QUEUES
        sessions = [Memory.session(f"queues-{i}", owner=None) for i in range(6)]
        for mem in sessions:
            mem.add_many(turns(6))  # committed: one index_session task each, after commit
        summaries = [mem.summarize_async() for mem in sessions]
        for mem in sessions:  # and a catch-up embed of each whole session: duplicates on purpose
            assert background.schedule_embedding(mem.id).state == "queued"
        # The backlog waits on Redis; no worker runs yet. The summarizer starts first: summaries
        # go through while 12 embedding tasks wait on their own queue.
        summarizer.start()
        wait_until(
            lambda: len(lines(summarizer, SUMMARIZE, "succeeded")) >= 6,
            60,
            0.2,
            f"six summaries:\n{summarizer.all_logs()[-3000:]}",
        )
        assert Snapshot.objects.count() == 6
        assert not Embedding.objects.exists()
        embedder.start()
        wait_until(
            lambda: sum(len(lines(embedder, t, "succeeded")) for t in EMBED) >= 12,
            60,
            0.2,
            f"twelve embedding tasks:\n{embedder.all_logs()[-3000:]}",
        )

    # Each worker ran only its own kind, and every task. (Delivery is at least once: under load
    # a task may be delivered again, harmlessly; what must hold exactly is the end state below.)
    assert not any(lines(embedder, SUMMARIZE, "received"))
    assert not any(lines(summarizer, t, "received") for t in EMBED)
    received = [
        {line.split("[", 1)[1].split("]", 1)[0] for line in lines(embedder, t, "received")}
        for t in EMBED
    ]
    # Six distinct tasks of each kind at least.
    assert all(len(ids) >= 6 for ids in received), received
    for task_id in summaries:
        assert (
            len(
                [
                    line
                    for line in summarizer.all_logs().splitlines()
                    if f"[{task_id}] succeeded" in line
                ]
            )
            == 1
        )
    # The results: one snapshot per session, one vector per message with text.
    for mem in sessions:
        snapshot = mem.latest_snapshot()
        assert (snapshot.version, snapshot.upto) == (1, 4)
    embedded = Embedding.objects.values_list("message_id", flat=True)
    assert len(embedded) == len(set(embedded)) == Message.objects.exclude(content="").count() == 36
