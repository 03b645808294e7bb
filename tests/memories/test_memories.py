"""Learned memories: facts with provenance and time, kept once, superseded not overwritten,
read as of a date, capped per owner by a documented rule, and never another owner's."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from memory_app import Memory
from memory_app.exceptions import InvalidItem, InvalidSearch
from memory_app.models import Item


def test_a_fact_is_kept_once_and_confirmed_when_found_again(learned, chat):
    first = learned.remember("Ada is allergic to peanuts", topic="diet", importance=0.6)
    assert first.text == "Ada is allergic to peanuts" and first.topic == "diet"
    assert first.importance == 0.6 and first.invalid_at is None and first.ended == ""
    again = chat.learned.remember("Ada is allergic to peanuts", importance=0.9)
    assert again.key == first.key and again.confirmations == 1 and again.importance == 0.9
    assert learned.count() == 1
    other = learned.remember("Ada lives in Oslo")
    assert other.key != first.key and other.importance == 1.0  # asked to keep: 1 by default
    assert learned.count() == 2


def test_an_update_supersedes_and_the_history_stays_readable(learned, chat):
    job = chat.learned.remember("Ada works at the bakery", cursors=[3])
    before_update = timezone.now()
    newer = learned.update(job.key, "Ada works at the library since May")
    assert newer.key == job.key and newer.session_id is None and newer.importance == 1.0
    history = learned.history(job.key)
    assert [v.text for v in history] == [
        "Ada works at the bakery",
        "Ada works at the library since May",
    ]
    assert history[0].ended == "superseded" and history[0].invalid_at == newer.valid_from
    assert history[0].session_id == chat.id and history[0].source_cursors == (3,)
    assert [m.text for m in learned.current()] == ["Ada works at the library since May"]
    # What was known before the update, now and in a search.
    assert [m.text for m in learned.current(as_of=before_update)] == ["Ada works at the bakery"]
    assert [m.text for m in learned.search("where does Ada work", as_of=before_update)] == [
        "Ada works at the bakery"
    ]
    assert [m.text for m in learned.search("where does Ada work")] == [
        "Ada works at the library since May"
    ]
    assert learned.current(as_of=before_update - dt.timedelta(days=1)) == []


def test_forgetting_ends_a_memory_but_keeps_its_history(learned):
    fact = learned.remember("Ada's locker code is 4411")
    assert learned.forget(fact.key) is True
    assert learned.current() == [] and learned.search("locker code") == []
    [old] = learned.history(fact.key)
    assert old.ended == "retired" and old.invalid_at is not None
    assert learned.forget(fact.key) is False


def test_the_cap_evicts_the_least_important_then_the_oldest(learned, settings):
    settings.MEMORY_APP = {"MEMORIES_PER_OWNER": 3}
    kept = {
        text: learned.remember(text, importance=importance)
        for text, importance in [
            ("Ada plays the cello", 0.9),
            ("Ada once ate a pear", 0.2),
            ("Ada has a brother", 0.5),
            ("Ada speaks Norwegian", 0.5),
        ]
    }
    assert sorted(m.text for m in learned.current()) == [
        "Ada has a brother",
        "Ada plays the cello",
        "Ada speaks Norwegian",
    ]
    assert learned.history(kept["Ada once ate a pear"].key)[0].ended == "evicted"
    # Equal importance: the older one goes first.
    learned.remember("Ada runs marathons", importance=0.7)
    assert "Ada has a brother" not in [m.text for m in learned.current()]
    assert learned.count() == 3


def test_another_owners_memories_are_never_seen(learned, other_user, chat):
    mine = learned.remember("Ada keeps bees")
    theirs = Memory.learned(other_user)
    assert theirs.current() == [] and theirs.search("bees") == []
    assert theirs.history(mine.key) == []
    with pytest.raises(InvalidItem):
        theirs.update(mine.key, "Bob keeps bees")
    assert theirs.forget(mine.key) is False
    assert [m.text for m in learned.current()] == ["Ada keeps bees"]


def test_filters_on_metadata_time_and_source(learned, chat, user):
    other = Memory.session("other", owner=user, namespace="elsewhere")
    chat.learned.remember("Ada's rent is 900", metadata={"amount": 900, "since": "2024-03-01"})
    chat.learned.remember("Ada's phone bill is 40", metadata={"amount": 40, "since": "2023-11-15"})
    other.learned.remember("Ada's gym costs 25", metadata={"amount": 25, "kind": "sport"})

    def texts(**filters):
        return sorted(m.text for m in learned.current(filters=filters))

    assert texts(metadata={"amount": {"$gt": 30}}) == [
        "Ada's phone bill is 40",
        "Ada's rent is 900",
    ]
    assert texts(metadata={"amount": {"$in": [25, 40]}}) == [
        "Ada's gym costs 25",
        "Ada's phone bill is 40",
    ]
    assert texts(metadata={"since": {"$gte": "2024-01-01"}}) == ["Ada's rent is 900"]
    assert texts(metadata={"kind": "sport"}) == ["Ada's gym costs 25"]
    assert texts(namespace="elsewhere") == ["Ada's gym costs 25"]
    assert texts(session=str(chat.id)) == ["Ada's phone bill is 40", "Ada's rent is 900"]
    assert texts(created_after=timezone.now().isoformat()) == []
    assert [m.text for m in learned.search("how much is the rent", filters={"namespace": "tests"})][
        :1
    ] == ["Ada's rent is 900"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda known: known.remember("  "), "text"),
        (lambda known: known.remember("x", importance=2), "importance"),
        (lambda known: known.remember("x", topic="t" * 101), "topic"),
        (lambda known: known.remember("x", metadata=[1]), "metadata"),
        (lambda known: known.remember("nul\x00"), "text"),
        (lambda known: known.current(as_of="yesterday"), "as_of"),
        (lambda known: known.update("no-such-key", "x"), "key"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(learned, call, field):
    with pytest.raises(InvalidItem) as raised:
        call(learned)
    assert raised.value.field == field
    assert not Item.objects.exists()


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"metadata": {"a": {"$near": 1}}}, "filters.metadata"),
        ({"metadata": {"a": {"$in": 5}}}, "filters.metadata"),
        ({"metadata": {"a": {"$gt": [1]}}}, "filters.metadata"),
        ({"metadata": {"a__b": 1}}, "filters.metadata"),
        ({"created_after": "soon"}, "filters.created_after"),
        ({"session": "not-a-uuid"}, "filters.session"),
        ({"colour": "red"}, "filters"),
        ("red", "filters"),
    ],
)
def test_bad_filters_name_their_field(learned, filters, field):
    with pytest.raises(InvalidSearch) as raised:
        learned.current(filters=filters)
    assert raised.value.field == field
