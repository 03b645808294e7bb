"""The pure fusion functions search uses (memory_app.services.fusion), and the variants the
recall benchmark measured (bench/fusion_variants.py)."""

from __future__ import annotations

import pytest

from bench import fusion_variants
from memory_app.services import fusion

VECTOR = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
FULLTEXT = [("c", 5.0), ("d", 0.2)]


def ids(ranking):
    return [item for item, _ in ranking]


def test_weighted_rrf_is_plain_rrf_with_equal_weights_and_follows_the_weights():
    plain = fusion.weighted_rrf({"v": VECTOR, "f": FULLTEXT}, k=60)
    assert ids(plain) == ["c", "a", "b", "d"]  # c is in both
    assert plain[0][1] == pytest.approx(1 / 63 + 1 / 61)
    leaning = fusion.weighted_rrf({"v": VECTOR, "f": FULLTEXT}, k=0, weights={"v": 1.0, "f": 0.0})
    assert ids(leaning)[:3] == ["a", "b", "c"]
    with pytest.raises(ValueError):
        fusion.weighted_rrf({"v": VECTOR}, k=-1)


def test_combsum_normalises_per_ranking_and_gives_missing_ids_the_floor():
    fused = fusion.combsum({"v": VECTOR, "f": FULLTEXT}, weights={"v": 0.5, "f": 0.5})
    scores = dict(fused)
    assert scores["c"] == pytest.approx(0.5 * 0.0 + 0.5 * 1.0)
    assert scores["a"] == pytest.approx(0.5 * 1.0)  # absent from full-text: its floor, 0
    assert set(scores) == {"a", "b", "c", "d"}
    z = dict(fusion.combsum({"v": VECTOR, "f": FULLTEXT}, method="z"))
    assert z["c"] > z["b"]
    with pytest.raises(ValueError):
        fusion.normalise(VECTOR, "rank")
    assert fusion.combsum({"v": [], "f": []}) == []
    assert fusion.normalise([("x", 2.0), ("y", 2.0)]) == {"x": 1.0, "y": 1.0}  # no spread


def test_confident_choice_takes_a_ranking_only_when_its_best_stands_out():
    sure = [("x", 10.0), ("z", 1.1), ("y", 1.0), ("w", 0.9)]
    fused = [("y", 3.0), ("q", 2.0)]
    chosen = fusion_variants.confident_choice({"f": sure, "v": VECTOR}, fused, threshold=3.0)
    assert ids(chosen) == ["x", "z", "y", "w", "q"]  # then the fused ones it lacked
    assert [s for _, s in chosen] == sorted((s for _, s in chosen), reverse=True)
    assert fusion_variants.confident_choice({"f": sure}, fused, threshold=1e9) == fused
    assert fusion_variants.confidence([("x", 1.0)]) == 0.0


def test_neighbour_boost_lifts_the_turn_next_to_a_match():
    ranking = [("q", 1.0), ("far", 0.6), ("answer", 0.5), ("x", 0.0)]
    neighbours = {"answer": ("q",), "q": ("answer",), "far": (), "x": ()}
    boosted = fusion.neighbour_boost(ranking, neighbours, weight=0.3)
    assert ids(boosted)[:3] == ["q", "answer", "far"]
    assert fusion.neighbour_boost(ranking, neighbours, weight=0) == ranking
