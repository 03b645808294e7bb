"""search(): session and owner scope, isolation between owners, the three modes."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from memory_app import Memory
from memory_app.exceptions import InvalidSearch
from memory_app.services.recall import FusionConfig, fuse
from memory_app.types import SearchResult


@pytest.mark.parametrize("mode", ["hybrid", "vector", "fulltext"])
def test_session_scope_finds_the_message_with_its_cursor(garden_chat, mode):
    results = garden_chat.search("when is the quarterly report due?", limit=3, mode=mode)
    assert results and isinstance(results[0], SearchResult)
    top = results[0]
    assert top.cursor == 3 and top.message.content.startswith("The quarterly report")
    assert top.session_id == garden_chat.id and top.score > 0
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    assert len(results) <= 3


def test_session_scope_stays_in_its_session(garden_chat, user, embedded):
    other = Memory.session("other-chat", owner=user, namespace="tests")
    embedded(other, ["The quarterly report was sent to the board yesterday."])
    for mode in ("hybrid", "vector", "fulltext"):
        found = garden_chat.search("quarterly report", limit=10, mode=mode)
        assert {r.session_id for r in found} == {garden_chat.id}


def test_owner_scope_searches_every_session_of_the_owner(garden_chat, user, embedded):
    travel = Memory.session("travel", owner=user, namespace="other-agent")
    embedded(travel, ["The passport renewal appointment is on Tuesday morning."])
    for mode in ("hybrid", "vector", "fulltext"):
        found = garden_chat.search(
            "passport renewal appointment", limit=3, scope="owner", mode=mode
        )
        assert found[0].session_id == travel.id and found[0].cursor == 1
        assert not garden_chat.search("passport renewal appointment", limit=3, mode="fulltext")


def test_another_owner_is_never_searched(garden_chat, other_user, embedded):
    theirs = Memory.session("garden", owner=other_user, namespace="tests")
    # Near-identical texts, and some that match the query better than anything of ours.
    embedded(
        theirs,
        [
            "My dog Biscuit is a golden retriever who loves the beach.",
            "golden retriever golden retriever dog dog beach",
        ],
    )
    ownerless = Memory.session("garden", owner=None, namespace="tests")
    embedded(ownerless, ["golden retriever dog beach Biscuit"])
    for scope in ("session", "owner"):
        for mode in ("hybrid", "vector", "fulltext"):
            found = garden_chat.search(
                "golden retriever dog beach", limit=10, scope=scope, mode=mode
            )
            assert found and {r.session_id for r in found} == {garden_chat.id}, (scope, mode)
            found = theirs.search("golden retriever dog beach", limit=10, scope=scope, mode=mode)
            assert {r.session_id for r in found} == {theirs.id}
            # Ownerless sessions only ever see ownerless sessions.
            found = ownerless.search("golden retriever dog beach", limit=10, scope=scope, mode=mode)
            assert {r.session_id for r in found} == {ownerless.id}


def test_roles_filter(garden_chat, embedded):
    embedded(garden_chat, ["The report is due in March, I noted it."], role="assistant")
    found = garden_chat.search("report due", limit=10, roles=["assistant"])
    assert [r.message.role for r in found] == ["assistant"]
    assert {r.message.role for r in garden_chat.search("report due", limit=10, roles=["user"])} == {
        "user"
    }


def test_hybrid_fuses_both_rankings_by_rrf_on_request(
    garden_chat, memory_settings_override, django_capture_on_commit_callbacks
):
    # Stored while embedding is off: only full-text search can see it.
    memory_settings_override(EMBED_ON_APPEND=False, IMPORTANCE_THRESHOLD=None)
    with django_capture_on_commit_callbacks(execute=True):
        hidden = garden_chat.add({"role": "user", "content": "Biscuit chewed the beach towel."})
    memory_settings_override(FUSION="rrf", NEIGHBOUR_BOOST=0)  # the fusion before CombSUM
    query = "Biscuit golden retriever at the beach"
    vector = garden_chat.search(query, limit=50, mode="vector")
    fulltext = garden_chat.search(query, limit=50, mode="fulltext")
    hybrid = garden_chat.search(query, limit=50, mode="hybrid")
    assert hidden.cursor not in [r.cursor for r in vector]
    assert hidden.cursor in [r.cursor for r in fulltext]
    # Every result of either ranking is in the fusion, scored 1/(60 + rank) per ranking.
    assert {r.cursor for r in hybrid} == {r.cursor for r in vector} | {r.cursor for r in fulltext}
    v_rank = {r.cursor: i for i, r in enumerate(vector, 1)}
    f_rank = {r.cursor: i for i, r in enumerate(fulltext, 1)}
    for r in hybrid:
        expected = sum(
            1 / (60 + ranks[r.cursor]) for ranks in (v_rank, f_rank) if r.cursor in ranks
        )
        assert r.score == pytest.approx(expected)
        assert r.ranks == {
            k: v
            for k, v in (("vector", v_rank.get(r.cursor)), ("fulltext", f_rank.get(r.cursor)))
            if v
        }
    # Found by both beats found by one: the dog message leads; the hidden one still makes it.
    assert hybrid[0].cursor == 2 and set(hybrid[0].ranks) == {"vector", "fulltext"}
    assert hybrid[0].score > next(r.score for r in hybrid if r.cursor == hidden.cursor)


def test_reciprocal_rank_fusion():
    config = FusionConfig(method="rrf", rrf_k=60, neighbour_boost=0)
    rankings = {"vector": [("x", 0.9), ("y", 0.5), ("z", 0.1)], "fulltext": [("z", 3.0), ("x", 1)]}
    fused = fuse(rankings, config)
    assert [item for item, _, _ in fused] == ["x", "z", "y"]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert fused[0][2] == {"vector": 1, "fulltext": 2}
    assert fused[2][1] == pytest.approx(1 / 62)


def test_fulltext_matches_any_word_by_default_or_all_on_request(
    garden_chat, memory_settings_override
):
    assert [r.cursor for r in garden_chat.search("risotto Lisbon", limit=5, mode="fulltext")] != []
    memory_settings_override(FULLTEXT_MATCH="all")
    assert garden_chat.search("risotto Lisbon", limit=5, mode="fulltext") == []
    assert [r.cursor for r in garden_chat.search("mushroom risotto", limit=5, mode="fulltext")] == [
        5
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": None}, "query"),
        ({"limit": 0}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"scope": "everyone"}, "scope"),
        ({"mode": "magic"}, "mode"),
        ({"roles": "user"}, "roles"),
        ({"roles": ["wizard"]}, "roles"),
    ],
)
def test_bad_arguments_raise_a_typed_error(mem, kwargs, field):
    args = {"query": "anything", **kwargs}
    with pytest.raises(InvalidSearch) as err:
        mem.search(args.pop("query"), **args)
    assert err.value.field == field


@pytest.mark.django_db(transaction=True)
def test_async_twins(user):
    async def scenario():
        mem = await Memory.asession("async", owner=user)
        await mem.aadd({"role": "user", "content": "the kettle whistles at dawn"})
        found = await mem.asearch("kettle whistles", limit=2)
        window = await mem.acontext("kettle", max_tokens=200)
        # The thread sync_to_async ran in holds its own connection: close it.
        await sync_to_async(connections.close_all)()
        return found, window

    found, window = asyncio.run(scenario())
    assert [r.cursor for r in found] == [1]
    assert window.messages == [{"role": "user", "content": "the kettle whistles at dawn"}]
