"""Triggers without a broker (eager mode): after append, on demand, and the management command."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from memory_app import Memory
from memory_app.models import Session
from memory_app.services.background import _local_run, needs_summary

from .conftest import turns

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit callbacks need real commits


@pytest.fixture
def threshold(settings):
    settings.MEMORY_APP = {"SUMMARIZE_THRESHOLD_TOKENS": 40, "SUMMARIZE_KEEP_RECENT": 2}


def tokens_after_snapshot(mem) -> int:
    return Session.objects.get(pk=mem.id).tokens_since_snapshot


def test_crossing_the_threshold_summarizes_after_the_append_commits(threshold):
    mem = Memory.session("auto", owner=None)
    for message in turns(3):
        mem.add(message)
    assert tokens_after_snapshot(mem) <= 40 and mem.snapshots() == []
    mem.add(turns(1, start=4)[0])
    assert tokens_after_snapshot(mem) > 40 or mem.snapshots()
    [snap] = mem.snapshots()
    assert snap.upto == 2  # keep_recent=2 of 4
    assert tokens_after_snapshot(mem) == sum(m.tokens for m in mem.messages(after=2))


def test_inside_a_transaction_it_waits_for_the_commit_and_a_rollback_triggers_nothing(threshold):
    mem = Memory.session("atomic", owner=None)
    with pytest.raises(RuntimeError), transaction.atomic():
        mem.add_many(turns(6))
        raise RuntimeError("rolled back")
    assert mem.count() == 0 and mem.snapshots() == []
    with transaction.atomic():
        mem.add_many(turns(6))
        assert mem.snapshots() == []  # not before the commit
    assert mem.latest_snapshot().upto == 4


def test_no_threshold_no_trigger(settings):
    settings.MEMORY_APP = {"SUMMARIZE_THRESHOLD_TOKENS": None, "SUMMARIZE_KEEP_RECENT": 0}
    mem = Memory.session("never", owner=None)
    mem.add_many(turns(50))
    assert mem.snapshots() == [] and not needs_summary(mem.id)


def test_one_run_per_session_at_a_time_in_eager_mode(threshold):
    mem = Memory.session("busy", owner=None)
    with _local_run(mem.id) as acquired:  # a run of this session is in progress
        assert acquired
        mem.add_many(turns(6))
        assert mem.snapshots() == []
    mem.add(turns(1, start=7)[0])
    assert mem.latest_snapshot().upto == 5


def test_a_failing_summarizer_never_fails_the_append(settings, openai_server, caplog):
    settings.MEMORY_APP = {
        "OPENAI": {"base_url": openai_server.base_url, "api_key": "t", "max_retries": 0},
        "SUMMARIZER": "memory_app.providers.summarizers.OpenAISummarizer",
        "SUMMARIZE_THRESHOLD_TOKENS": 40,
        "SUMMARIZE_KEEP_RECENT": 2,
    }
    openai_server.fail_next(50, status=500)
    mem = Memory.session("failing", owner=None)
    with caplog.at_level(logging.ERROR, logger="memory_app"):
        stored = mem.add_many(turns(6))
    assert [m.cursor for m in stored] == [1, 2, 3, 4, 5, 6]
    assert mem.snapshots() == []
    assert "summarization of session" in caplog.text and "injected failure" in caplog.text
    # Inline, nobody retries later: one try; the over-threshold sweep catches up.
    assert len(openai_server.requests_to("/chat/completions")) == 1


def test_a_deleted_session_is_nothing_to_do(settings):
    from memory_app.tasks import summarize_session

    mem = Memory.session("gone", owner=None)
    mem.add_many(turns(5))
    mem.delete()
    assert summarize_session.apply(args=[str(mem.id)]).get() is None


def test_summarize_async_runs_eagerly_without_a_broker(settings):
    settings.MEMORY_APP = {"SUMMARIZE_THRESHOLD_TOKENS": None}
    mem = Memory.session("demand", owner=None)
    mem.add_many(turns(5))
    task_id = mem.summarize_async(keep_recent=1)
    snap = mem.latest_snapshot()
    assert snap.upto == 4 and snap.metadata["idempotency_key"] == task_id


class TestCommand:
    @pytest.fixture
    def sessions(self, settings):
        settings.MEMORY_APP = {"SUMMARIZE_THRESHOLD_TOKENS": None, "SUMMARIZE_KEEP_RECENT": 2}
        big = Memory.session("big", owner=None, namespace="a")
        big.add_many(turns(10))
        small = Memory.session("small", owner=None, namespace="a")
        small.add_many(turns(3))
        other = Memory.session("other", owner=None, namespace="b")
        other.add_many(turns(10))
        return big, small, other

    def run(self, *args) -> str:
        from io import StringIO

        out = StringIO()
        call_command("memory_summarize", *args, "--no-progress", stdout=out, stderr=StringIO())
        return out.getvalue()

    def test_needs_a_selection(self, sessions):
        with pytest.raises(CommandError):
            call_command("memory_summarize")
        with pytest.raises(CommandError, match="--session"):
            self.run("--session", "not-a-uuid")

    def test_all_sync_in_a_namespace(self, sessions):
        big, small, other = sessions
        assert self.run("--all", "--namespace", "a", "--sync").strip() == (
            "2 compacted, 0 skipped (nothing to cover), 0 failed"
        )
        assert big.latest_snapshot().upto == 8 and small.latest_snapshot().upto == 1
        assert other.snapshots() == []
        assert self.run("--session", str(other.id), "--sync", "--keep-recent", "5").startswith(
            "1 compacted"
        )
        assert other.latest_snapshot().upto == 5

    def test_sync_runs_until_a_backlog_is_covered(self, sessions, settings):
        settings.MEMORY_APP = {**settings.MEMORY_APP, "SUMMARIZE_MAX_INPUT_TOKENS": 30}
        big, small, other = sessions
        assert self.run("--session", str(big.id), "--sync").startswith("1 compacted")
        assert [s.upto for s in big.snapshots()] == [2, 4, 6, 8]

    def test_over_threshold_sweep(self, sessions):
        big, small, other = sessions
        out = self.run("--over-threshold", "--threshold", "60")
        assert out.strip() == "2 enqueued, 0 skipped (already queued or nothing to cover), 0 failed"
        assert big.latest_snapshot().upto == 8 and other.latest_snapshot().upto == 8
        assert small.snapshots() == []
        # Caught up: a second sweep finds nothing over the threshold.
        assert self.run("--over-threshold", "--threshold", "60").startswith("0 enqueued")
        with pytest.raises(CommandError, match="SUMMARIZE_THRESHOLD_TOKENS"):
            self.run("--over-threshold")

    def test_failures_are_reported_and_the_rest_goes_on(self, sessions, settings, openai_server):
        settings.MEMORY_APP = {
            "OPENAI": {"base_url": openai_server.base_url, "api_key": "t", "max_retries": 0},
            "SUMMARIZER": "memory_app.providers.summarizers.OpenAISummarizer",
            "SUMMARIZE_THRESHOLD_TOKENS": None,
            "SUMMARIZE_KEEP_RECENT": 2,
        }
        openai_server.fail_next(1)
        with pytest.raises(CommandError, match="1 session"):
            self.run("--all", "--sync")
        assert sum(len(Memory.get(s.id, owner=s.owner_id).snapshots()) for s in sessions) == 2
