"""Which models go where across replicas (`nxctl mux plan --replicas N`): each model a home replica so that
every model is resident somewhere at once, when such a packing exists; else homes for the models that serve
the most requests of a trace (the most models without one), and the others named with the reason. Then a replay of a trace predicts the hit rate the placement gives.

Packing is bin packing, so it is searched exhaustively: models largest first, each into a replica with room
(replicas of equal budget and equal load are one choice, so symmetric packings are tried once), up to
SEARCH_NODES steps; a search cut short says so (``exhaustive`` False) and keeps the best it found (first
fit, largest first, is always among them).

Routing in the prediction is the seat's: a request goes to its model's home. A model without a home goes to
the replica with the most room beside its homes where it fits alone, and takes its turn in that replica's
residency pool (LRU, evicting what is idle); one larger than every replica's budget is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError
from engine.mux.registry import Registry, mb
from engine.mux.replay import DEFAULT_LOAD_GBPS, ReplayResult, replay
from engine.mux.trace import TraceRequest

SEARCH_NODES = 200_000
MAX_REPLICAS = 64


@dataclass(frozen=True)
class Placement:
    """``homes[m]``: model m's replica (index into ``budgets``); ``unplaced[m]``: why m has none."""

    budgets: tuple[int, ...]
    sizes: Mapping[int, int]
    homes: Mapping[int, int]
    unplaced: Mapping[int, str]
    exhaustive: bool

    def models_on(self, replica: int) -> list[int]:
        return sorted(m for m, r in self.homes.items() if r == replica)

    def bytes_on(self, replica: int) -> int:
        return sum(self.sizes[m] for m in self.models_on(replica))

    @property
    def complete(self) -> bool:
        """Whether every model is resident somewhere."""
        return not self.unplaced

    def route(self, model: int) -> int | None:
        """The replica a request for ``model`` goes to (the module docstring); None: refused everywhere."""
        if model in self.homes:
            return self.homes[model]
        fits = [r for r, budget in enumerate(self.budgets) if self.sizes[model] <= budget]
        return max(fits, key=lambda r: (self.budgets[r] - self.bytes_on(r), -r)) if fits else None


def place_models(
    sizes: Mapping[int, int], budgets: Sequence[int], weights: Mapping[int, int] | None = None
) -> Placement:
    """A home for every model of ``sizes`` (bytes by model id) across replicas of ``budgets`` (bytes) if
    one exists, else for the models of the most ``weights`` (a trace's requests per model; default one
    each), then the most models, then the most bytes."""
    if not budgets or len(budgets) > MAX_REPLICAS:
        raise InvalidRequestError(f"plan for 1 to {MAX_REPLICAS} replicas, got {len(budgets)}")
    if any(b <= 0 for b in budgets):
        raise InvalidRequestError("every replica's memory budget must be positive")
    if not sizes:
        raise InvalidRequestError("no models to place")
    order = sorted(sizes, key=lambda m: (-sizes[m], m))
    weight = weights if weights is not None else dict.fromkeys(sizes, 1)
    search = _Search([sizes[m] for m in order], [weight.get(m, 0) for m in order], list(budgets))
    search.run(0, [])
    homes = {order[i]: r for i, r in enumerate(search.best) if r >= 0}
    largest = max(budgets)
    unplaced = {
        m: (
            f"needs {mb(sizes[m]):.0f} MB; the largest replica budget is {mb(largest):.0f} MB"
            if sizes[m] > largest
            else "no room left beside the other models' homes"
        )
        for m in order
        if m not in homes
    }
    return Placement(tuple(budgets), dict(sizes), homes, unplaced, search.exhaustive)


class _Search:
    """Depth-first search over homes for models of ``sizes`` (largest first): -1 is no home. A packing
    scores (its models' weights, their count, their bytes), compared in that order."""

    def __init__(self, sizes: list[int], weights: list[int], budgets: list[int]):
        self.sizes, self.weights, self.budgets = sizes, weights, budgets
        self.free = list(budgets)
        self.best: list[int] = [-1] * len(sizes)
        self.best_score = (-1, -1, -1)
        self.nodes = 0
        self.exhaustive = True
        # what models i.. add at most: [(weights, count, bytes)] by i
        self.rest = [(sum(weights[i:]), len(sizes) - i, sum(sizes[i:])) for i in range(len(sizes) + 1)]

    def score(self, homes: list[int]) -> tuple[int, int, int]:
        placed = [i for i, h in enumerate(homes) if h >= 0]
        return sum(self.weights[i] for i in placed), len(placed), sum(self.sizes[i] for i in placed)

    def run(self, i: int, homes: list[int]) -> bool:
        """Extend ``homes`` (models 0..i-1); True once every model has one (the search stops)."""
        score = self.score(homes)
        if i == len(self.sizes):
            if score > self.best_score:
                self.best, self.best_score = homes.copy(), score
            return score[1] == len(self.sizes)
        bound = tuple(a + b for a, b in zip(score, self.rest[i], strict=True))
        if bound <= self.best_score:
            return False  # even every model left placed would not beat the best
        self.nodes += 1
        if self.nodes > SEARCH_NODES:
            self.exhaustive = False
            return False
        tried: set[tuple[int, int]] = set()
        for r, free in enumerate(self.free):
            if self.sizes[i] > free or (self.budgets[r], free) in tried:
                continue
            tried.add((self.budgets[r], free))
            self.free[r] -= self.sizes[i]
            done = self.run(i + 1, [*homes, r])
            self.free[r] += self.sizes[i]
            if done:
                return True
        return self.run(i + 1, [*homes, -1])


@dataclass(frozen=True)
class ReplicaReplay:
    """One replica's share of a trace replayed under its budget (None: no request went to it)."""

    replica: int
    result: ReplayResult | None


def predict_hits(
    registry: Registry,
    trace: Sequence[TraceRequest],
    placement: Placement,
    load_gbps: float = DEFAULT_LOAD_GBPS,
) -> tuple[float, list[ReplicaReplay], int]:
    """The hit rate (hits over every request of ``trace``) when each replica serves the requests the
    placement routes to it with an LRU residency pool under its budget; each replica's replay; the requests
    refused everywhere (models larger than every budget)."""
    if not trace:
        raise InvalidRequestError("the trace holds no requests")
    shares: list[list[TraceRequest]] = [[] for _ in placement.budgets]
    refused = 0
    for request in trace:
        replica = placement.route(request.model)
        if replica is None:
            refused += 1
        else:
            shares[replica].append(request)
    replays = [
        ReplicaReplay(r, replay(registry, share, placement.budgets[r], "lru", load_gbps) if share else None)
        for r, share in enumerate(shares)
    ]
    hits = sum(p.result.hits for p in replays if p.result is not None)
    return hits / len(trace), replays, refused


def placement_json(placement: Placement, names: Mapping[int, str]) -> dict[str, Any]:
    """The placement as `nxctl mux plan --json` prints it."""
    replicas = [
        {
            "replica": r,
            "budget_mb": mb(budget),
            "models": [names[m] for m in placement.models_on(r)],
            "models_mb": [mb(placement.sizes[m]) for m in placement.models_on(r)],
            "homed_mb": mb(placement.bytes_on(r)),
        }
        for r, budget in enumerate(placement.budgets)
    ]
    unplaced = [{"model": names[m], "reason": why} for m, why in placement.unplaced.items()]
    return {
        "complete": placement.complete,
        "exhaustive": placement.exhaustive,
        "replicas": replicas,
        "unplaced": unplaced,
    }
