"""Fusion variants the recall benchmark measured and the app did not choose (the app's own
fusions are ``memory_app/services/fusion.py``).

- ``confident_choice``: per query, one ranking alone when its best score stands out from its
  own candidates by at least ``threshold`` standard deviations, the fused ranking otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memory_app.services.fusion import Ranking


def confidence(ranking: Ranking) -> float:
    """How far the best score stands above the others, in standard deviations (0 when unsure)."""
    if len(ranking) < 3:
        return 0.0
    rest = [float(s) for _, s in ranking[1:]]
    mean = math.fsum(rest) / len(rest)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in rest) / len(rest))
    return (float(ranking[0][1]) - mean) / spread if spread > 0 else 0.0


def confident_choice(
    rankings: Mapping[str, Ranking], fused: Ranking, *, threshold: float
) -> list[tuple[Any, float]]:
    """The most confident ranking alone when its ``confidence()`` reaches ``threshold``, followed
    by the fused results it lacks; otherwise ``fused`` unchanged."""
    best_name, best = None, threshold
    for name, ranking in rankings.items():
        c = confidence(ranking)
        if c >= best:
            best_name, best = name, c
    if best_name is None:
        return list(fused)
    chosen = list(rankings[best_name])
    have = {item for item, _ in chosen}
    floor = min((s for _, s in chosen), default=0.0)
    return chosen + [
        (item, floor - 1.0 - i) for i, (item, _) in enumerate(fused) if item not in have
    ]
