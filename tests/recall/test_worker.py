"""With a broker, embedding runs in a real Celery worker, after the append commits."""

from __future__ import annotations

import time

import pytest

from memory_app import Memory
from memory_app.models import Embedding
from memory_app.tasks import embed_messages

# The worker reaches the test database over a socket: PostgreSQL only (SQLite tests use memory).
pytestmark = [pytest.mark.celery, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_a_worker_embeds_after_commit_and_duplicates_store_nothing_twice(
    celery_worker_process, user
):
    mem = Memory.session("worker", owner=user)
    stored = mem.add_many(
        [
            {"role": "user", "content": "the orchard has forty apple trees"},
            {"role": "assistant", "content": "apples ripen in late September"},
        ]
    )
    # add_many returned at once: the embedding is the worker's job.
    assert [m.cursor for m in stored] == [1, 2]
    assert wait_for(lambda: Embedding.objects.filter(session=mem.session).count() == 2)

    # At-least-once delivery: the same task delivered again changes nothing.
    embed_messages.delay(str(mem.id), [1, 2])
    embed_messages.delay(str(mem.id), [1, 2])
    mem.add({"role": "user", "content": "the cider press is in the barn"})
    # One solo worker on one queue runs tasks in order: once this one is done, so are those.
    assert wait_for(lambda: Embedding.objects.filter(session=mem.session).count() == 3)
    assert Embedding.objects.filter(session=mem.session).values("message").distinct().count() == 3
    assert [r.cursor for r in mem.search("apple trees in the orchard", limit=1)] == [1]
