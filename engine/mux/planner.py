"""Capacity planning for real model files (`nxctl mux plan`): footprints, which sets fit, largest contexts.

For each model: its footprint at the given engine settings, whether it fits the budget alone, and the
largest context its KV pool could hold alone under the budget (weights and activations first, the rest
as KV blocks; capped by the model's max_position_embeddings). For the set: every maximal combination of
models that fits together at their configured KV pools (no model can be added to it and still fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from engine.errors import InvalidRequestError
from engine.mux.footprint import Footprint
from engine.mux.registry import mb

MAX_MODELS = 16


@dataclass(frozen=True)
class CapacityPlan:
    budget_bytes: int
    footprints: tuple[Footprint, ...]
    fitting_sets: tuple[tuple[int, ...], ...]  # indices into footprints, maximal sets, largest bytes first

    def fits_alone(self, index: int) -> bool:
        return self.footprints[index].total_bytes <= self.budget_bytes

    def max_context(self, index: int) -> int:
        return self.footprints[index].max_context(self.budget_bytes)

    def set_bytes(self, members: Sequence[int]) -> int:
        return sum(self.footprints[i].total_bytes for i in members)

    def to_json(self) -> dict[str, Any]:
        models = [
            {**f.to_json(), "fits_alone": self.fits_alone(i), "max_context_alone": self.max_context(i)}
            for i, f in enumerate(self.footprints)
        ]
        sets = [
            {"models": [self.footprints[i].name for i in s], "total_mb": mb(self.set_bytes(s))}
            for s in self.fitting_sets
        ]
        return {"budget_mb": mb(self.budget_bytes), "models": models, "fitting_sets": sets}


def plan_capacity(footprints: Sequence[Footprint], budget_bytes: int) -> CapacityPlan:
    """The plan for ``footprints`` under ``budget_bytes`` (at most MAX_MODELS models)."""
    if budget_bytes <= 0:
        raise InvalidRequestError(f"the memory budget must be positive, got {mb(budget_bytes):g} MB")
    if not footprints:
        raise InvalidRequestError("no models to plan for")
    if len(footprints) > MAX_MODELS:
        raise InvalidRequestError(f"plan at most {MAX_MODELS} models at once, got {len(footprints)}")
    sizes = [f.total_bytes for f in footprints]
    everyone = range(len(sizes))
    maximal = []
    for k in range(len(sizes), 0, -1):
        for members in combinations(everyone, k):
            total = sum(sizes[i] for i in members)
            # maximal: it fits, and adding any model left out would not
            if total <= budget_bytes and all(
                total + sizes[j] > budget_bytes for j in everyone if j not in members
            ):
                maximal.append(members)
    maximal.sort(key=lambda s: (-sum(sizes[i] for i in s), s))
    return CapacityPlan(budget_bytes, tuple(footprints), tuple(maximal))
