"""SessionMemory.compact(): covered range, compare-and-swap, concurrency, failures."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from memory_app import Memory
from memory_app.exceptions import EmptySummary, InvalidSnapshot, SnapshotConflict, SummarizerError
from memory_app.models import Message, Session
from memory_app.providers.summarizers import ExtractiveSummarizer, Summarizer
from memory_app.services.compaction import covered_range
from memory_app.types import StoredMessage
from tests.conftest import tool_turn

from .conftest import turns


def stored(roles: str) -> list[StoredMessage]:
    """Messages from a role string: u=user, a=assistant, c=assistant with 1 tool call, t=tool."""
    out, call = [], 0
    for cursor, r in enumerate(roles, start=1):
        if r == "c":
            call += 1
            out.append(StoredMessage(cursor, "assistant", "", tool_calls=[{"id": f"c{call}"}]))
        elif r == "t":
            out.append(StoredMessage(cursor, "tool", "r", tool_call_id=f"c{call}"))
        else:
            out.append(
                StoredMessage(cursor, {"u": "user", "a": "assistant", "s": "system"}[r], "x")
            )
    return out


def cursors(messages) -> list[int]:
    return [m.cursor for m in messages]


class TestCoveredRange:
    def test_all_but_keep_recent(self):
        assert cursors(covered_range(stored("uauau"), 2)) == [1, 2, 3]
        assert covered_range(stored("ua"), 2) == []
        assert covered_range(stored("ua"), 5) == []
        assert cursors(covered_range(stored("ua"), 0)) == [1, 2]

    @pytest.mark.parametrize("keep", [1, 2, 3])
    def test_never_ends_inside_a_tool_group(self, keep):
        # u a c t t u a: a call with two results at cursors 3-5 (one group).
        messages = stored("uactu")
        messages.insert(4, StoredMessage(5, "tool", "r2", tool_call_id="c1"))
        messages = [
            StoredMessage(
                i + 1, m.role, m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id
            )
            for i, m in enumerate(messages)
        ]
        covered = covered_range(messages, keep)
        assert cursors(covered) == ([1, 2, 3, 4, 5] if keep == 1 else [1, 2])

    def test_keeps_tool_calls_out_until_their_results_are_in(self):
        # The log ends with a call whose result is not stored yet: leave the call out.
        assert cursors(covered_range(stored("uac"), 0)) == [1, 2]
        # Two calls, one answered so far.
        two = [
            *stored("ua"),
            StoredMessage(3, "assistant", "", tool_calls=[{"id": "x"}, {"id": "y"}]),
            StoredMessage(4, "tool", "r", tool_call_id="x"),
        ]
        assert cursors(covered_range(two, 0)) == [1, 2]
        # All answered: the whole group may be covered.
        assert cursors(covered_range(stored("uact"), 0)) == [1, 2, 3, 4]
        # Followed by another turn, an unanswered call is over: it is covered normally.
        assert cursors(covered_range(stored("uacua"), 2)) == [1, 2, 3]

    def test_token_budget(self):
        def costly(roles):
            return [
                StoredMessage(
                    m.cursor,
                    m.role,
                    m.content,
                    tool_calls=m.tool_calls,
                    tool_call_id=m.tool_call_id,
                    tokens=10,
                )
                for m in stored(roles)
            ]

        assert cursors(covered_range(costly("uauauau"), 1, max_tokens=25)) == [1, 2]
        assert cursors(covered_range(costly("uauauau"), 1, max_tokens=None)) == [1, 2, 3, 4, 5, 6]
        # The budget runs out inside a tool group: stop before the group.
        assert cursors(covered_range(costly("ucttua"), 1, max_tokens=25)) == [1]
        # A first group larger than the budget still goes, whole.
        assert cursors(covered_range(costly("cttua"), 1, max_tokens=5)) == [1, 2, 3]
        assert cursors(covered_range(costly("uauau"), 1, max_tokens=5)) == [1]

    def test_orphan_results_at_the_start_are_not_split_from_nothing(self):
        assert covered_range(stored("ttua"), 3) == []
        assert cursors(covered_range(stored("ttua"), 2)) == [1, 2]


@pytest.fixture
def extractive(settings):
    settings.MEMORY_APP = {"SUMMARIZE_KEEP_RECENT": 2, "SUMMARIZE_THRESHOLD_TOKENS": None}


def test_compact_updates_the_summary_and_saves_at_the_last_covered_cursor(mem, extractive):
    mem.add_many([{"role": "system", "content": "Be brief."}, *turns(5)])
    snap = mem.compact()
    assert (snap.version, snap.upto, snap.model) == (1, 4, "extractive")
    assert snap.summary.splitlines() == [
        "user: msg-001 says hello.",
        "assistant: msg-002 says hello.",
        "user: msg-003 says hello.",
    ]
    assert snap.metadata["covered_from"] == 1 and snap.metadata["covered_messages"] == 4
    assert mem.compact() is None  # only keep_recent messages after it
    mem.add_many(turns(3, start=6))
    snap2 = mem.compact(keep_recent=1)
    assert (snap2.version, snap2.upto) == (2, 8)
    # Updated, not rewritten: the old lines stay, the new turns follow.
    assert snap2.summary.startswith(snap.summary + "\n")
    assert snap2.summary.splitlines()[3:] == [
        "assistant: msg-004 says hello.",
        "user: msg-005 says hello.",
        "assistant: msg-006 says hello.",
        "user: msg-007 says hello.",
    ]
    window = mem.window()  # the system prompt, the summary, the one kept message
    assert window.snapshot_version == 2 and window.cursors == [1, None, 9]
    session = Session.objects.get(pk=mem.id)
    assert session.tokens_since_snapshot == sum(m.tokens for m in mem.messages(after=8))


def test_compact_carries_pinned_messages_and_validates_arguments(mem, extractive):
    mem.add_many(turns(6))
    mem.save_snapshot("first", upto=2, pinned=[{"role": "user", "content": "Goal: ship it"}])
    snap = mem.compact(keep_recent=1)
    assert snap.pinned == [{"role": "user", "content": "Goal: ship it"}]
    for bad in (-1, "2", True):
        with pytest.raises(InvalidSnapshot):
            mem.compact(keep_recent=bad)
    with pytest.raises(InvalidSnapshot):
        mem.compact(max_attempts=0)


def test_tool_groups_are_never_split_in_the_store(mem, extractive):
    mem.add_many(
        [*turns(2), *tool_turn("call_1"), {"role": "assistant", "content": "It is sunny."}]
    )
    # keep_recent=2 would cut between the call (3) and its result (4): cover 1-2 only.
    snap = mem.compact(keep_recent=2)
    assert snap.upto == 2
    assert mem.compact(keep_recent=2) is None
    # A pending call at the end (result not stored yet) is not covered either.
    mem.add_many(
        [
            {"role": "user", "content": "And Bergen?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    }
                ],
            },
        ]
    )
    snap = mem.compact(keep_recent=0)
    assert snap.upto == 6
    window = mem.window()
    # The summary; the pending call is left out (OpenAI refuses a call without its result).
    assert [m["role"] for m in window.messages] == ["user"]
    assert window.unanswered_tool_calls == ("call_2",)
    mem.add({"role": "tool", "tool_call_id": "call_2", "content": "rain"})
    assert mem.compact(keep_recent=0).upto == 8


def test_a_run_covers_at_most_the_token_budget(mem, settings):
    settings.MEMORY_APP = {"SUMMARIZE_KEEP_RECENT": 2, "SUMMARIZE_MAX_INPUT_TOKENS": 30}
    mem.add_many(turns(8))  # 13 tokens each
    first = mem.compact()
    assert (first.upto, first.metadata["partial"]) == (2, True)
    assert [mem.compact().upto, mem.compact().upto] == [4, 6]
    assert "partial" not in mem.latest_snapshot().metadata
    assert mem.compact() is None


def test_pruning_keeps_compaction_going(mem, settings):
    settings.MEMORY_APP = {"SUMMARIZE_KEEP_RECENT": 2, "PRUNE_COMPACTED": True}
    mem.add_many([{"role": "system", "content": "Be brief."}, *turns(6)])
    assert mem.compact().upto == 5
    assert [m.cursor for m in mem.messages()] == [1, 6, 7]  # the system prompt stays
    mem.add_many(turns(3, start=7))
    snap = mem.compact()
    assert snap.upto == 8 and snap.summary.count("\n") == 6  # 4 + 3 turns, one line each
    assert [m.cursor for m in mem.messages()] == [1, 9, 10]


def test_idempotency_key_saves_one_snapshot(mem, extractive):
    mem.add_many(turns(6))
    first = mem.compact(idempotency_key="task-1")
    mem.add_many(turns(4, start=7))  # there is new material to cover...
    again = mem.compact(idempotency_key="task-1")
    assert again == first  # ...but that run already saved its snapshot
    assert len(mem.snapshots()) == 1
    assert mem.compact(idempotency_key="task-2").version == 2


class RacingSummarizer(Summarizer):
    """Saves a competing snapshot (as another process would) while it "thinks"."""

    model = "racing"

    def __init__(self, mem, races: int):
        self.other = Memory.get(mem.id, owner=mem.owner_id)
        self.races = races
        self.calls: list[tuple[str | None, list[int]]] = []

    def summarize(self, previous_summary, messages):
        self.calls.append((previous_summary, [m.cursor for m in messages]))
        if len(self.calls) <= self.races:
            _, tail = self.other.load_snapshot()
            self.other.save_snapshot(
                f"competitor {len(self.calls)}",
                upto=tail[0].cursor,
                prev=self.other.latest_snapshot(),
            )
        return f"ours after {previous_summary}"


def test_cas_conflict_reloads_and_retries(mem, extractive):
    mem.add_many(turns(8))
    summarizer = RacingSummarizer(mem, races=1)
    snap = mem.compact(summarizer=summarizer)
    # First try covered 1-6 from scratch; a competitor saved v1 (upto 1) meanwhile; the retry
    # updated the competitor's summary with 2-6 only.
    assert summarizer.calls == [(None, [1, 2, 3, 4, 5, 6]), ("competitor 1", [2, 3, 4, 5, 6])]
    assert (snap.version, snap.upto, snap.summary) == (2, 6, "ours after competitor 1")
    assert [s.summary for s in mem.snapshots()] == ["competitor 1", "ours after competitor 1"]


def test_cas_gives_up_after_max_attempts(mem, extractive):
    mem.add_many(turns(8))
    summarizer = RacingSummarizer(mem, races=99)
    with pytest.raises(SnapshotConflict):
        mem.compact(summarizer=summarizer, max_attempts=2)
    assert len(summarizer.calls) == 2
    assert [s.summary for s in mem.snapshots()] == ["competitor 1", "competitor 2"]


class EmptySummarizer(Summarizer):
    def summarize(self, previous_summary, messages):
        return "  "


def test_a_failed_or_empty_summary_saves_nothing(mem, llm_settings, openai_server):
    mem.add_many(turns(5))
    openai_server.fail_next(1, status=500)
    with pytest.raises(SummarizerError):
        mem.compact()
    openai_server.reply_with("")
    with pytest.raises(EmptySummary):
        mem.compact()
    with pytest.raises(EmptySummary):  # any summarizer's empty answer, not only the LLM's
        mem.compact(summarizer=EmptySummarizer())
    assert mem.snapshots() == []
    assert Session.objects.get(pk=mem.id).tokens_since_snapshot == sum(
        m.tokens for m in mem.messages()
    )
    openai_server.reply_with("Five greetings.")
    snap = mem.compact()
    assert (snap.summary, snap.upto, snap.model) == ("Five greetings.", 3, "test-summarizer")


@pytest.mark.django_db(transaction=True)  # sync_to_async runs on another connection
def test_acompact(mem, extractive):
    mem.add_many(turns(4))

    async def compact():
        try:
            return await mem.acompact(keep_recent=1, summarizer=ExtractiveSummarizer(max_chars=50))
        finally:
            await sync_to_async(connections.close_all)()

    snap = asyncio.run(compact())
    assert snap.upto == 3 and len(snap.summary) <= 50


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_compaction_with_concurrent_appends(user, llm_settings, openai_server):
    """Appends made while the summarizer runs are neither lost, duplicated nor covered."""
    mem = Memory.session("concurrent", owner=user)
    mem.add_many(turns(40))
    llm_settings["SUMMARIZE_KEEP_RECENT"] = 5
    asked, appended = threading.Event(), threading.Event()

    def slow_reply(request):
        asked.set()
        appended.wait(20)  # the summarizer "thinks" until every appender is done
        return "Forty greetings, summarized."

    openai_server.chat_handler = slow_reply
    result, errors = [], []

    def run(fn):
        try:
            result.append(fn())
        except Exception as err:  # surfaced below
            errors.append(err)
        finally:
            connections.close_all()

    compactor = threading.Thread(
        target=run, args=(lambda: Memory.get(mem.id, owner=user).compact(),)
    )
    compactor.start()
    assert asked.wait(20)

    def append(worker: int):
        handle = Memory.get(mem.id, owner=user)
        for i in range(10):
            handle.add({"role": "user", "content": f"late-{worker}-{i}"})

    appenders = [threading.Thread(target=run, args=(lambda w=w: append(w),)) for w in range(4)]
    for t in appenders:
        t.start()
    for t in appenders:
        t.join(30)
    appended.set()
    compactor.join(30)
    assert not errors, errors

    snapshot = next(r for r in result if r is not None)
    assert (snapshot.version, snapshot.upto) == (1, 35)
    # The summarizer saw exactly messages 1-35.
    [request] = openai_server.requests_to("/chat/completions")
    text = request["body"]["messages"][1]["content"]
    assert "msg-035" in text and "msg-036" not in text and "late-" not in text
    # Every message is stored once, with gapless cursors.
    messages = mem.messages()
    assert [m.cursor for m in messages] == list(range(1, 81))
    late = [m.content for m in messages if m.content.startswith("late-")]
    assert sorted(late) == sorted(f"late-{w}-{i}" for w in range(4) for i in range(10))
    assert Message.objects.filter(session_id=mem.id).count() == 80
    # The window: summary, then everything after the snapshot.
    window = mem.window()
    assert window.cursors == [None, *range(36, 81)]
    session = Session.objects.get(pk=mem.id)
    assert session.tokens_since_snapshot == sum(m.tokens for m in messages if m.cursor > 35)
