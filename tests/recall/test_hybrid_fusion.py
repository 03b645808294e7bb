"""Hybrid search's fusion (MEMORY_APP["FUSION"], "NEIGHBOUR_BOOST"): CombSUM of normalised
scores plus a boost from neighbouring turns by default, reciprocal rank fusion on request."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from memory_app import Memory
from tests.recall.conftest import add_turns

RRF = {"FUSION": "rrf", "NEIGHBOUR_BOOST": 0, "HYBRID_CANDIDATES": 50}


@pytest.fixture
def unembedded(memory_settings_override, django_capture_on_commit_callbacks):
    """Append with embedding off: only full-text search can see these turns."""

    def append(mem, texts, **extra):
        memory_settings_override(EMBED_ON_APPEND=False, IMPORTANCE_THRESHOLD=None)
        with django_capture_on_commit_callbacks(execute=True):
            stored = add_turns(mem, texts, **extra)
        memory_settings_override()  # the defaults again
        return stored

    return append


def cursors(results):
    return [r.cursor for r in results]


def test_a_strong_fulltext_match_the_vectors_never_saw_is_found(
    db, user, embedded, unembedded, memory_settings_override
):
    mem = Memory.session("ferries", owner=user, namespace="tests")
    # Every other turn shares one word with the query, so both rankings find it.
    embedded(
        mem,
        [
            "I usually leave for work at eight.",
            "We watched a documentary about the history of tea.",
            "The ferry was cancelled last winter because of the storms.",
            "My sister is learning to play the cello.",
            "My brother will leave for Berlin on Friday.",
            "The bakery on the corner sells great croissants.",
        ],
    )
    (hidden,) = unembedded(mem, ["Zanzibar ferry: the Zanzibar ferry leaves at dawn, Zanzibar!"])
    query = "When does the Zanzibar ferry leave?"
    vector = mem.search(query, limit=50, mode="vector")
    fulltext = mem.search(query, limit=50, mode="fulltext")
    assert hidden.cursor not in cursors(vector)
    assert cursors(fulltext)[0] == hidden.cursor

    # Ranks alone: every turn both rankings found outscores a first place in one of them.
    memory_settings_override(**RRF)
    assert hidden.cursor not in cursors(mem.search(query, limit=3, mode="hybrid"))
    # Scores: its lead in full text counts, whatever the vector ranking missed.
    memory_settings_override(NEIGHBOUR_BOOST=0)
    combsum = mem.search(query, limit=3, mode="hybrid")
    assert hidden.cursor in cursors(combsum)
    assert next(r for r in combsum if r.cursor == hidden.cursor).ranks == {"fulltext": 1}
    memory_settings_override()
    assert hidden.cursor in cursors(mem.search(query, limit=3, mode="hybrid"))


def test_the_neighbour_boost_lifts_the_answer_after_a_matching_question(
    db, user, embedded, memory_settings_override
):
    mem = Memory.session("trip", owner=user, namespace="tests")
    embedded(
        mem,
        [
            "I bought a new pair of hiking boots.",
            "Have you been to the observatory in the Atacama desert?",
            "Yes, last Tuesday! The sky was unbelievable.",
            "My sister is learning to play the cello.",
            "We should repaint the fence before autumn.",
            "The bakery on the corner sells great croissants.",
            "Tuesday is the day the recycling gets collected.",
        ],
    )
    query = "When did they visit the observatory in the Atacama desert?"
    question, answer = 2, 3
    memory_settings_override(NEIGHBOUR_BOOST=0)
    plain = cursors(mem.search(query, limit=10, mode="hybrid"))
    assert plain[0] == question and plain.index(answer) > 1
    memory_settings_override()  # the default boost
    boosted = mem.search(query, limit=10, mode="hybrid")
    assert cursors(boosted)[:2] == [question, answer]
    assert boosted[1].score > boosted[2].score


def test_the_boost_follows_turns_within_their_own_session(
    db, user, other_user, embedded, memory_settings_override
):
    # Owner scope: the reply after the matching question is boosted past a better match at the
    # same cursor in another session (by cursor alone both would gain the same), and another
    # owner's turns never appear.
    mine = Memory.session("observatory", owner=user, namespace="tests")
    embedded(
        mine,
        [
            "Have you been to the observatory in the Atacama desert?",
            "Yes, last Tuesday! The sky was unbelievable.",
        ],
    )
    elsewhere = Memory.session("chores", owner=user, namespace="other-agent")
    embedded(
        elsewhere,
        [
            "We should repaint the fence before autumn.",
            "I read that the desert sky is dark enough for stargazing.",
        ],
    )
    theirs = Memory.session("observatory", owner=other_user, namespace="tests")
    embedded(
        theirs,
        [
            "The observatory in the Atacama desert: have you been?",
            "Yes, last Tuesday! The observatory in the Atacama desert was unbelievable.",
        ],
    )
    query = "When did they visit the observatory in the Atacama desert?"
    reply, better = (mine.id, 2), (elsewhere.id, 2)
    memory_settings_override(NEIGHBOUR_BOOST=0)
    plain = [(r.session_id, r.cursor) for r in mine.search(query, limit=10, scope="owner")]
    assert plain[0] == (mine.id, 1) and plain.index(better) < plain.index(reply)
    memory_settings_override()  # the default boost
    found = mine.search(query, limit=10, scope="owner", mode="hybrid")
    assert {r.session_id for r in found} <= {mine.id, elsewhere.id}
    assert [(r.session_id, r.cursor) for r in found[:2]] == [(mine.id, 1), reply]
    for scope in ("session", "owner"):
        seen = theirs.search(query, limit=10, scope=scope, mode="hybrid")
        assert {r.session_id for r in seen} == {theirs.id}


def test_rrf_restores_the_fusion_before(db, user, embedded, memory_settings_override):
    mem = Memory.session("rrf", owner=user, namespace="tests")
    embedded(
        mem,
        [
            "My dog Biscuit is a golden retriever who loves the beach.",
            "Biscuit chewed the beach towel.",
            "The beach was crowded on Sunday.",
            "We painted the kitchen green.",
        ],
    )
    memory_settings_override(**RRF)
    query = "Biscuit at the beach"
    vector = {r.cursor: i for i, r in enumerate(mem.search(query, limit=50, mode="vector"), 1)}
    fulltext = {r.cursor: i for i, r in enumerate(mem.search(query, limit=50, mode="fulltext"), 1)}
    hybrid = mem.search(query, limit=50, mode="hybrid")
    assert {r.cursor for r in hybrid} == set(vector) | set(fulltext)
    for r in hybrid:
        ranks = {"vector": vector.get(r.cursor), "fulltext": fulltext.get(r.cursor)}
        assert r.ranks == {k: v for k, v in ranks.items() if v}
        assert r.score == pytest.approx(sum(1 / (60 + v) for v in r.ranks.values()))
    assert [r.score for r in hybrid] == sorted((r.score for r in hybrid), reverse=True)


@pytest.mark.parametrize(
    "setting",
    [
        {"FUSION": "borda"},
        {"FUSION_NORMALISATION": "softmax"},
        {"FUSION_VECTOR_WEIGHT": 1.5},
        {"FUSION_VECTOR_WEIGHT": "0.5"},
        {"RRF_K": -1},
        {"NEIGHBOUR_BOOST": float("nan")},
        {"NEIGHBOUR_BOOST": True},
    ],
)
def test_bad_fusion_settings_are_refused(garden_chat, memory_settings_override, setting):
    memory_settings_override(**setting)
    name = next(iter(setting))
    with pytest.raises(ImproperlyConfigured, match=name):
        garden_chat.search("report", mode="hybrid")
    assert "memory_app.E030" in {e.id for e in run_checks()}
    # The single modes do not fuse: they still answer.
    assert garden_chat.search("quarterly report", mode="fulltext")
