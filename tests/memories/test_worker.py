"""Extraction on a real Celery worker through Redis: the after-append task starts it, and a
duplicated delivery of the extraction task keeps each fact once."""

from __future__ import annotations

import pytest

from memory_app import Memory
from memory_app.models import Session
from memory_app.tasks import extract_memories
from tests.celery_worker import wait_until

pytestmark = [pytest.mark.celery, pytest.mark.postgres]

TASK = "memory_app.extract_memories"


def test_an_append_has_the_worker_learn_the_fact_once(celery_worker, user):
    mem = Memory.session("worker-facts", owner=user, namespace="tests")
    mem.add_many(
        [
            {"role": "user", "content": "hello"},
            {"role": "user", "content": "Please remember that my son is called Leo."},
        ]
    )
    # The after-append task on the worker saw a remembered message: extraction was queued.
    celery_worker.wait_for_log(f"Task {TASK}[")
    fact = wait_until(lambda: mem.learned.current(), message="the fact learned")[0]
    assert fact.text == "Please remember that my son is called Leo."
    assert fact.session_id == mem.id and fact.source_cursors == (2,)
    assert Session.objects.get(pk=mem.id).extracted_upto == 2
    # The same message delivered twice more: the batch was applied already.
    for _ in range(2):
        extract_memories.apply_async(args=[str(mem.id)], task_id=f"dup-{mem.id}")
    celery_worker.wait_for_log(f"[dup-{mem.id}] succeeded", times=2)
    assert [m.text for m in mem.learned.current()] == [fact.text]
    assert mem.learned.history(fact.key)[0].confirmations == 0
