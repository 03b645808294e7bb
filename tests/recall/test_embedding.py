"""Messages are embedded by a task queued after the append commits; importance promotes."""

from __future__ import annotations

import re

import pytest
from django.db import transaction
from hypothesis import given
from hypothesis import strategies as st

from memory_app import Memory
from memory_app.importance import KeywordImportanceScorer
from memory_app.models import Embedding, Message
from memory_app.providers.embeddings import get_embedder
from memory_app.tasks import embed_messages, embed_session
from memory_app.types import StoredMessage
from tests.recall.conftest import celery_publishing_to


def embedded_cursors(mem) -> list[int]:
    return sorted(
        Embedding.objects.filter(session=mem.session).values_list("message__seq", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_embedding_waits_for_commit_and_a_rollback_embeds_nothing(user):
    mem = Memory.session("commit", owner=user)
    with transaction.atomic():
        mem.add_many(
            [
                {"role": "user", "content": "the blue heron nests by the lake"},
                {"role": "assistant", "content": "herons are patient hunters"},
            ]
        )
        assert embedded_cursors(mem) == []  # not before the commit
    assert embedded_cursors(mem) == [1, 2]
    stored = Embedding.objects.filter(session=mem.session).first()
    assert stored.owner_id == user.pk and stored.model == get_embedder().name
    assert stored.dimensions == len(stored.vector) == get_embedder().dimensions

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        mem.add({"role": "user", "content": "this append is rolled back"})
        raise Abort
    assert Message.objects.filter(session=mem.session).count() == 2
    assert embedded_cursors(mem) == [1, 2]


def test_one_scheduling_per_append_with_every_cursor(mem, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        mem.add_many(
            [{"role": "user", "content": f"fact number {i} about gardens"} for i in range(5)]
        )
    ours = [c for c in callbacks if "schedule_after_append" in getattr(c, "__qualname__", "")]
    assert len(ours) == 1
    assert embedded_cursors(mem) == []  # nothing before the append commits
    ours[0]()  # no broker: the one scheduled run embeds the whole batch inline
    assert embedded_cursors(mem) == [1, 2, 3, 4, 5]


def test_an_unreachable_broker_never_fails_an_append(
    mem, django_capture_on_commit_callbacks, caplog
):
    with celery_publishing_to(
        "redis://127.0.0.1:9/0",
        task_publish_retry=False,
        broker_connection_timeout=0.5,
        broker_connection_retry=False,
    ):
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            stored = mem.add({"role": "user", "content": "stored although the queue is down"})
    # due, and failed, fast:
    assert any("schedule_after_append" in getattr(c, "__qualname__", "") for c in callbacks)
    assert "could not schedule the after-append job of session" in caplog.text
    assert "Connection refused" in caplog.text
    assert stored.cursor == 1 and mem.count() == 1  # the append did not
    assert embedded_cursors(mem) == []  # memory_embed catches up later


def test_tasks_are_idempotent(mem, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        mem.add_many(
            [
                {"role": "user", "content": "salmon swim upstream"},
                {"role": "user", "content": "bears wait at the falls"},
            ]
        )
    before = list(
        Embedding.objects.filter(session=mem.session).order_by("id").values_list("id", "vector")
    )
    # A redelivered task stores nothing twice.
    assert embed_messages.apply(args=(str(mem.id), [1, 2])).get() == 0
    assert embed_messages.apply(args=(str(mem.id), [1, 2])).get() == 0
    assert Embedding.objects.filter(session=mem.session).count() == 2
    # embed_session re-embeds: new rows, same vectors, still one per message and model.
    assert embed_session.delay(str(mem.id)).get() == 2
    after = list(
        Embedding.objects.filter(session=mem.session).order_by("id").values_list("id", "vector")
    )
    assert len(after) == 2 and {a[0] for a in after}.isdisjoint({b[0] for b in before})
    assert [list(a[1]) for a in after] == [list(b[1]) for b in before]
    # A deleted session is not an error.
    sid = str(mem.id)
    mem.delete()
    assert embed_messages.apply(args=(sid, [1])).get() == 0


def test_embed_on_append_off_still_embeds_remembered_messages(
    mem, memory_settings_override, django_capture_on_commit_callbacks
):
    memory_settings_override(EMBED_ON_APPEND=False)
    with django_capture_on_commit_callbacks(execute=True):
        plain = mem.add({"role": "user", "content": "the weather was mild today"})
        flagged = mem.add({"role": "user", "content": "my locker code is 4471", "remember": True})
        scored = mem.add({"role": "user", "content": "Please remember that my name is Ada."})
    assert (plain.remember, flagged.remember, scored.remember) == (False, True, True)
    assert dict(Message.objects.filter(session=mem.session).values_list("seq", "remember")) == {
        1: False,
        2: True,
        3: True,
    }
    assert embedded_cursors(mem) == [2, 3]
    # The backfill embeds the rest.
    assert mem.embed() == 1
    assert embedded_cursors(mem) == [1, 2, 3]


def test_importance_scoring_is_transparent_and_configurable(
    mem, memory_settings_override, django_capture_on_commit_callbacks
):
    scorer = KeywordImportanceScorer()
    said = StoredMessage(cursor=1, role="user", content="I always prefer window seats")
    assert scorer.score(said) == 1.0
    assert [w for _, w in scorer.explain(said)] == [0.5, 0.5]
    assert scorer.score(StoredMessage(cursor=1, role="assistant", content="I always help")) == 0
    assert scorer.score(StoredMessage(cursor=1, role="user", content="what time is it")) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assistant = mem.add({"role": "assistant", "content": "Remember to hydrate, always."})
        small_talk = mem.add({"role": "user", "content": "nice, see you tomorrow"})
    assert not assistant.remember and not small_talk.remember
    memory_settings_override(IMPORTANCE_THRESHOLD=None)
    with django_capture_on_commit_callbacks(execute=True):
        off = mem.add({"role": "user", "content": "remember: scoring is off now"})
    assert not off.remember


def test_should_recall_skips_what_cannot_help(mem, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        mem.add_many(
            [
                {"role": "user", "content": "ok thanks"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "the museum opens at nine"},
            ]
        )
    assert embedded_cursors(mem) == [3]


PHRASES = [
    "remember", "Don't forget", "my name is", "call me", "I'm allergic", "allergies",
    "my birthday", "my email", "My Husband", "I always", "never", "prefers", "I like",
    "I can't stand", "from now on", "going forward", "in the future", "important",
    "keep in mind", "note that", "recall", "person", "weather", "Tuesday", "ok",
    "misremember", "i", "I", "ALWAYS", "Never", "in", "my", "x", "_",
]  # fmt: skip
WORDS = st.lists(st.sampled_from(PHRASES) | st.text(max_size=8), max_size=8)
SEPARATORS = st.sampled_from([" ", "", ", ", "\n", "-", "'", "_"])


def plainly(patterns, text: str) -> list[tuple[str, float]]:
    """What each pattern finds searched the plain way: the reference the scorer must equal."""
    return [(p, float(w)) for p, w in patterns if re.search(p, text, re.IGNORECASE)]


@given(WORDS, SEPARATORS)
def test_the_scorer_finds_what_a_plain_search_finds(words, separator):
    # The scorer searches from each pattern's literal (on the lowercased text), and checks the
    # leading \b and lookbehinds after: what it finds must be what a plain search finds.
    text = separator.join(words)
    message = StoredMessage(cursor=1, role="user", content=text)
    scorer = KeywordImportanceScorer()
    assert scorer.explain(message) == plainly(KeywordImportanceScorer.PATTERNS, text)


CUSTOM = [
    (r"\bNASA\b", 1.0),  # upper case: searched without lowercasing, IGNORECASE
    (r"\b(ab)c\1", 0.5),  # a capturing group: searched as it is
    (r"(?i)\bzeta\b|\beta\b", 0.5),  # inline global flags: searched as it is
    (r"(?<![a-z])x+y|[]|]z", 0.2),  # a lookbehind, and a class holding "]" and "|"
    (r"\Bnot\W", 0.2),
]


@given(st.lists(st.sampled_from(["nasa", "NASA", "abcab", "xabcab", "Zeta", "beta", "eta",
                                 "xxy", "axy", "]z", "|z", "knot!", "not!", "q"]), max_size=6),
       SEPARATORS)  # fmt: skip
def test_custom_patterns_find_what_a_plain_search_finds(words, separator):
    text = separator.join(words)
    message = StoredMessage(cursor=1, role="user", content=text)
    assert KeywordImportanceScorer(patterns=CUSTOM).explain(message) == plainly(CUSTOM, text)
    lowercase = [(p, w) for p, w in CUSTOM if p == p.lower()]
    assert KeywordImportanceScorer(patterns=lowercase).explain(message) == plainly(lowercase, text)
