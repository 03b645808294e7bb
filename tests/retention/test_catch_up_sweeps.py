"""The summarize and embed sweeps schedule what the after-append triggers missed, in batches,
once each, and report it (inline here: no broker; on real workers in test_queues.py)."""

from __future__ import annotations

import pytest

from memory_app import tasks
from memory_app.models import Embedding, Message, Snapshot
from memory_app.services import retention
from memory_app.services.embedding import count_missing

from .conftest import make_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def low_threshold(settings):
    settings.MEMORY_APP = {
        "SUMMARIZE_THRESHOLD_TOKENS": 30,
        "SUMMARIZE_KEEP_RECENT": 2,
        "IMPORTANCE_SCORER": None,
    }


def test_the_summary_sweep_compacts_sessions_over_the_threshold(low_threshold):
    # Appends in a test transaction never commit: the after-append trigger never fired.
    over = [make_session(messages=12) for _ in range(5)]
    under = make_session(messages=2)
    done = tasks.sweep_summaries.delay(batch_size=2).get()
    assert done == {
        "checked": 5,
        "queued": 0,
        "ran": 5,
        "pending": 0,
        "failed": 0,
        "skipped": 0,
        "batches": 3,
    }
    for mem in over:
        assert mem.latest_snapshot().upto == 10  # all but the 2 newest
    assert not Snapshot.objects.filter(session_id=under.id).exists()
    again = retention.sweep_summaries(batch_size=2)
    assert (again["checked"], again["ran"]) == (0, 0)  # nothing is summarized twice
    assert Snapshot.objects.count() == 5


def test_the_summary_sweep_skips_sessions_with_nothing_to_cover(low_threshold):
    mem = make_session(messages=0)
    mem.add_many(
        [{"role": "user", "content": "word " * 40}, {"role": "assistant", "content": "ok " * 40}]
    )
    done = retention.sweep_summaries()
    assert (done["checked"], done["skipped"], done["ran"]) == (1, 1, 0)  # only keep_recent left


def test_no_threshold_no_sweep(settings):
    settings.MEMORY_APP = {"SUMMARIZE_THRESHOLD_TOKENS": None}
    make_session(messages=12)
    assert retention.sweep_summaries()["checked"] == 0


def test_the_embedding_sweep_embeds_what_is_missing_once(settings):
    sessions = [make_session(messages=3) for _ in range(5)]
    assert count_missing() == 15  # never committed: never indexed
    assert retention.sweep_embeddings()["sessions"] == 0  # not stale yet: their job may come
    done = tasks.sweep_embeddings.delay(batch_size=2, pending_older_than=0).get()
    assert done == {
        "sessions": 5,
        "queued": 0,
        "ran": 5,
        "failed": 0,
        "batches": 3,
        "caught_up": 5,
    }
    assert not Message.objects.filter(index_pending=True).exists()
    assert count_missing() == 0
    assert Embedding.objects.count() == 15
    assert retention.sweep_embeddings()["sessions"] == 0
    assert {e.session_id for e in Embedding.objects.all()} == {m.id for m in sessions}


def test_without_embed_on_append_the_sweep_embeds_only_remembered_ones(settings):
    settings.MEMORY_APP = {"EMBED_ON_APPEND": False, "IMPORTANCE_SCORER": None}
    mem = make_session(messages=0)
    mem.add_many(
        [
            {"role": "user", "content": "plain"},
            {"role": "user", "content": "keep this", "remember": True},
        ]
    )
    make_session(messages=2)
    done = retention.sweep_embeddings(pending_older_than=0)
    assert (done["sessions"], done["ran"], done["caught_up"]) == (2, 2, 2)
    remembered = Message.objects.get(session_id=mem.id, remember=True)
    assert list(Embedding.objects.values_list("message_id", flat=True)) == [remembered.pk]
    # A vector goes missing later (a new embedder): the second phase embeds remembered ones only.
    Embedding.objects.all().delete()
    done = retention.sweep_embeddings()
    assert (done["sessions"], done["ran"], done["caught_up"]) == (1, 1, 0)
    assert list(Embedding.objects.values_list("message_id", flat=True)) == [remembered.pk]
