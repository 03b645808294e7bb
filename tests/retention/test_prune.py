"""The sweeps that delete: expired sessions, idle ones, and logs over their namespace's
max_messages; in bounded batches, each reporting what it did; and as the beat tasks."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from memory_app import tasks
from memory_app.exceptions import InvalidCursor, InvalidSession
from memory_app.models import Embedding, Message, Session, Snapshot
from memory_app.services import retention
from memory_app.services.embedding import embed_messages

from .conftest import make_session

pytestmark = pytest.mark.django_db

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)


def test_prune_expired_deletes_expired_sessions_in_batches():
    expired = [make_session(expires_in=-HOUR) for _ in range(7)]
    alive = [make_session(expires_in=HOUR), make_session(), make_session(idle_for=400 * DAY)]
    embed_messages(session_ids=[m.id for m in expired + alive])
    embedded = Embedding.objects.filter(session_id__in=[m.id for m in expired]).count()
    assert embedded  # the prune takes vectors along
    done = retention.prune_expired(batch_size=3)
    assert done == {
        "sessions": 7,
        "messages": 14,
        "snapshots": 0,
        "embeddings": embedded,
        "batches": 3,
    }
    assert set(Session.objects.values_list("pk", flat=True)) == {m.id for m in alive}
    assert not Message.objects.filter(session_id__in=[m.id for m in expired]).exists()
    assert retention.prune_expired(batch_size=3)["sessions"] == 0  # nothing left: a no-op


def test_prune_expired_at_a_given_time_and_in_one_namespace():
    soon = make_session("a", expires_in=HOUR)
    later = make_session("a", expires_in=3 * DAY)
    elsewhere = make_session("b", expires_in=HOUR)
    done = retention.prune_expired(now=timezone.now() + 2 * HOUR, namespace="a")
    assert done["sessions"] == 1
    assert not Session.objects.filter(pk=soon.id).exists()
    assert Session.objects.filter(pk__in=[later.id, elsewhere.id]).count() == 2


def test_prune_idle_deletes_sessions_not_updated_for_long():
    old = [make_session("a", idle_for=40 * DAY) for _ in range(5)]
    fresh = make_session("a", idle_for=DAY)
    other = make_session("b", idle_for=40 * DAY)
    done = retention.prune_idle("30d", batch_size=2, namespace="a")
    assert (done["sessions"], done["messages"], done["batches"]) == (5, 10, 3)
    assert not Session.objects.filter(pk__in=[m.id for m in old]).exists()
    assert Session.objects.filter(pk__in=[fresh.id, other.id]).count() == 2
    assert retention.prune_idle(dt.timedelta(days=30))["sessions"] == 1  # every namespace


def test_max_batches_bounds_one_run():
    for _ in range(5):
        make_session(expires_in=-HOUR)
    assert retention.prune_expired(batch_size=2, max_batches=1)["sessions"] == 2
    assert Session.objects.count() == 3


@pytest.mark.parametrize("bad", [0, -1, "10", 2.5, True])
def test_a_bad_batch_size_is_refused_naming_it(bad):
    with pytest.raises(InvalidCursor) as raised:
        retention.prune_expired(batch_size=bad)
    assert raised.value.field == "batch_size"


def test_a_bad_idle_duration_is_refused_naming_it():
    for bad in ("soon", "0d", None, -3):
        with pytest.raises(InvalidSession) as raised:
            retention.prune_idle(bad)
        assert raised.value.field == "older_than"


def test_the_beat_tasks_prune_and_report(settings):
    settings.MEMORY_APP = {"RETENTION": {"chat": {"idle": "30d"}, "*": {"idle": "365d"}}}
    for _ in range(4):
        make_session("chat", expires_in=-HOUR)
    idle = [make_session("chat", idle_for=40 * DAY) for _ in range(3)]
    kept = [make_session("other", idle_for=40 * DAY), make_session("chat", idle_for=DAY)]
    ancient = make_session("other", idle_for=400 * DAY)
    assert tasks.prune_expired.delay(batch_size=3).get()["sessions"] == 4
    for _ in range(2):
        make_session("chat", expires_in=-HOUR)
    done = tasks.apply_retention.delay(batch_size=2).get()
    assert (done["expired"]["sessions"], done["expired"]["batches"]) == (2, 1)
    assert (done["idle"]["sessions"], done["idle"]["messages"]) == (
        4,
        8,
    )  # 3 chat + 1 ancient other
    assert done["trimmed"] == {"sessions": 0, "messages": 0, "batches": 0}
    gone = [m.id for m in idle] + [ancient.id]
    assert not Session.objects.filter(pk__in=gone).exists()
    assert Session.objects.filter(pk__in=[m.id for m in kept]).count() == 2


# ---- max_messages ------------------------------------------------------------


def bounded_session(namespace: str = "bounded"):
    """14 messages: a system prompt at 1, a remembered one at 4; a snapshot covers 1..10."""
    mem = make_session(namespace, messages=0)
    mem.add({"role": "system", "content": "You are terse."})
    for cursor in range(2, 15):
        mem.add(
            {
                "role": "user" if cursor % 2 else "assistant",
                "content": f"note {cursor}",
                "remember": cursor == 4,
            }
        )
    mem.save_snapshot("The first ten notes.", upto=10, prev=None)
    return mem


def cursors(mem) -> list[int]:
    return [m.cursor for m in mem.messages()]


def counters(mem) -> tuple[int, int]:
    return Session.objects.values_list("message_count", "token_count").get(pk=mem.id)


def test_max_messages_trims_only_covered_non_system_non_remembered(settings):
    settings.MEMORY_APP = {
        "RETENTION": {"bounded": {"max_messages": 5}, "roomy": {"max_messages": 10}}
    }
    tight, roomy = bounded_session("bounded"), bounded_session("roomy")
    unsummarized = make_session("bounded", messages=12)  # over the bound, no snapshot
    elsewhere = bounded_session("unbounded")
    done = retention.trim_to_policy(batch_size=2)
    # tight: 9 over the bound, but only 8 messages are covered and prunable
    assert cursors(tight) == [1, 4, 11, 12, 13, 14]
    # roomy: 4 over the bound: the oldest four prunable ones go
    assert cursors(roomy) == [1, 4, 7, 8, 9, 10, 11, 12, 13, 14]
    assert cursors(unsummarized) == list(range(1, 13))
    assert cursors(elsewhere) == list(range(1, 15))
    assert done == {"sessions": 2, "messages": 12, "batches": 2}  # bounded: 2 in one, roomy: 1
    for mem in (tight, roomy, unsummarized):
        assert counters(mem) == (len(cursors(mem)), sum(m.tokens for m in mem.messages()))
    # The window still starts from the summary and keeps what the agent needs.
    window = tight.window()
    assert window.messages[0]["role"] == "system"
    assert "The first ten notes." in window.messages[1]["content"]
    assert Snapshot.objects.filter(session_id=tight.id).count() == 1
    assert retention.trim_to_policy()["messages"] == 0  # again: nothing more may go


def test_max_messages_from_the_default_entry(settings):
    settings.MEMORY_APP = {"RETENTION": {"*": {"max_messages": 5}, "kept": {"ttl": "1d"}}}
    anywhere, kept = bounded_session("anywhere"), bounded_session("kept")
    assert tasks.apply_retention.delay().get()["trimmed"]["messages"] == 8
    assert cursors(anywhere) == [1, 4, 11, 12, 13, 14]
    assert cursors(kept) == list(range(1, 15))  # its own entry sets no bound
