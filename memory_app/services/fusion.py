"""Fusing rankings: pure functions from lists of ``(id, score)`` (best first) to one ranking.

Nothing here touches the database: search computes the rankings (vector, full-text) and hands
them over, so the fusions can be measured offline (``bench/locomo_recall.py --folds``) on
exactly the inputs they see in production. Variants that were measured and not chosen live with
the benchmark (``bench/fusion_variants.py``). Each function returns ``[(id, score), ...]`` best
first; ties keep the order of first appearance.

- ``weighted_rrf``: reciprocal rank fusion with a weight per ranking,
  ``sum_r w_r / (k + rank_r)``. Uses ranks only, so it is blind to how sure a ranking is.
- ``combsum``: the weighted sum of each ranking's scores after normalising them per query
  (``"minmax"`` to [0, 1], or ``"z"`` to zero mean and unit spread over the candidates); an id a
  ranking did not return gets that ranking's floor (0 for min-max, the lowest z for z-scores).
  Scores carry confidence that ranks throw away: a full-text match on a rare name stands out.
- ``neighbour_boost``: re-ranks by adding ``weight`` times the best score among an item's
  neighbours (the turns just before and after it), so the turn that answers "yes, last
  Tuesday!" rises when the question it answers matched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from ..conf import memory_settings
from ..types import FUSION_NORMALISATIONS as NORMALISATIONS

Ranking = Sequence[tuple[Hashable, float]]


def _ordered(scores: dict[Any, float], first_seen: dict[Any, int]) -> list[tuple[Any, float]]:
    return sorted(scores.items(), key=lambda item: (-item[1], first_seen[item[0]]))


def _first_seen(rankings: Mapping[str, Ranking]) -> dict[Any, int]:
    seen: dict[Any, int] = {}
    for ranking in rankings.values():
        for item, _ in ranking:
            seen.setdefault(item, len(seen))
    return seen


def weighted_rrf(
    rankings: Mapping[str, Ranking], *, k: float = 60.0, weights: Mapping[str, float] | None = None
) -> list[tuple[Any, float]]:
    """Reciprocal rank fusion: ``sum over rankings of weight / (k + rank)`` (ranks from 1)."""
    if k < 0:
        raise ValueError("k must be >= 0")
    scores: dict[Any, float] = {}
    for name, ranking in rankings.items():
        weight = 1.0 if weights is None else float(weights.get(name, 0.0))
        for rank, (item, _) in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return _ordered(scores, _first_seen(rankings))


def normalise(ranking: Ranking, method: str = "minmax") -> dict[Any, float]:
    """``{id: normalised score}`` of one ranking (see ``combsum``)."""
    if method not in NORMALISATIONS:
        raise ValueError(f"method must be one of {', '.join(NORMALISATIONS)}")
    values = [float(score) for _, score in ranking]
    if not values:
        return {}
    if method == "minmax":
        low, high = min(values), max(values)
        span = high - low
        return {item: (float(s) - low) / span if span > 0 else 1.0 for item, s in ranking}
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return {item: (float(s) - mean) / spread if spread > 0 else 0.0 for item, s in ranking}


def combsum(
    rankings: Mapping[str, Ranking],
    *,
    weights: Mapping[str, float] | None = None,
    method: str = "minmax",
) -> list[tuple[Any, float]]:
    """Weighted sum of per-query normalised scores; a missing id gets the ranking's floor."""
    normalised = {name: normalise(r, method) for name, r in rankings.items()}
    floors = {
        name: (min(n.values()) if n else 0.0) if method == "z" else 0.0
        for name, n in normalised.items()
    }
    first_seen = _first_seen(rankings)
    scores: dict[Any, float] = {}
    for item in first_seen:
        total = 0.0
        for name, n in normalised.items():
            weight = 1.0 if weights is None else float(weights.get(name, 0.0))
            total += weight * n.get(item, floors[name])
        scores[item] = total
    return _ordered(scores, first_seen)


def neighbour_boost(
    ranking: Ranking, neighbours: Mapping[Any, Sequence[Hashable]], *, weight: float
) -> list[tuple[Any, float]]:
    """Add ``weight`` x the best min-max-normalised score among each item's neighbours."""
    if not weight:
        return list(ranking)
    scores = normalise(ranking, "minmax")
    first_seen = {item: i for i, (item, _) in enumerate(ranking)}
    boosted = {
        item: s + weight * max((scores.get(n, 0.0) for n in neighbours.get(item, ())), default=0.0)
        for item, s in scores.items()
    }
    return _ordered(boosted, first_seen)


# ---- the settings in force ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """How hybrid search fuses (the ``FUSION*``, ``RRF_K`` and ``NEIGHBOUR_BOOST`` settings)."""

    method: str = "combsum"
    normalisation: str = "minmax"
    vector_weight: float = 0.5
    rrf_k: float = 60
    neighbour_boost: float = 0.5


def fusion_config() -> FusionConfig:
    """The fusion settings in force (each checked by its rule when read: a bad value raises
    ``ImproperlyConfigured``)."""
    return FusionConfig(
        method=memory_settings.FUSION,
        normalisation=memory_settings.FUSION_NORMALISATION,
        vector_weight=float(memory_settings.FUSION_VECTOR_WEIGHT),
        rrf_k=float(memory_settings.RRF_K),
        neighbour_boost=float(memory_settings.NEIGHBOUR_BOOST),
    )
