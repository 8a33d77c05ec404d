"""Which replica a request goes to: its model's holders, then the longest prefix, within a load bound.

    choose(replicas, key, book, bound):
      1. candidates: the replicas that hold the key's model (reported resident, or sent it within the
         book's memory of recent sends); none holds it -> every replica (the chosen one loads it). A
         holder must not run hot while others idle: when even the least loaded holder has more than
         ``bound`` requests beyond the least loaded replica, every replica is a candidate (the model
         spills: the one chosen loads it too, under its own budget).
      2. affinity: the candidate whose remembered blocks match the longest run of the prompt's leading
         blocks, if that run is more than MIN_MATCH (half) of the prompt's full blocks: a shared
         chat-template preamble, a block or two of a longer prompt, is no reason to follow it.
      3. the bound: the affine replica wins unless it has more than ``bound`` requests in flight beyond
         the least loaded candidate; otherwise (or with no affinity) the least loaded candidate, ties
         broken by fewest resident models when the model is not held anywhere, then by fewest remembered
         blocks (distinct prompts spread over the replicas), then by replica id.

Load is a replica's requests in flight (Ray Serve's count of its ongoing requests: running and waiting);
"beyond" compares it with the least loaded one's. The book remembers, per replica, the block hashes of
the prompts sent there (an LRU bounded at ``capacity`` hashes per replica) and where each model was
last sent; it does not know what a replica's prefix cache has since evicted: a stale entry costs one
cache miss, never a wrong answer. Pure: no Ray, the same for tests and for Ray's router (ray_router.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nxctl.server.route_keys import RouteKey

LOAD_BOUND = 4  # requests in flight beyond the least loaded replica that affinity may cost
MIN_MATCH = 0.5  # a prefix pulls a prompt to a replica when it is more than this of its full blocks
PREFIX_CAPACITY = 1 << 16  # block hashes remembered per replica (an LRU)
MODEL_MEMORY_S = 5.0  # a model sent to a replica counts as held there this long, whatever it reported


@dataclass(frozen=True)
class ReplicaView:
    """A replica at routing time: its id, requests in flight, the models it reported resident."""

    id: str
    load: int
    models: frozenset[str] = frozenset()


class RouteBook:
    """What the router remembers of past routing: block hashes and models sent to each replica.
    ``record`` and ``forget`` mutate; ``match``, ``holders`` and ``size`` only read."""

    def __init__(
        self,
        capacity: int = PREFIX_CAPACITY,
        model_memory_s: float = MODEL_MEMORY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert capacity >= 1 and model_memory_s >= 0
        self.capacity, self.model_memory_s, self.clock = capacity, model_memory_s, clock
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._sent: dict[tuple[str, str], float] = {}  # (replica, model) -> when last sent

    def match(self, replica: str, blocks: Sequence[int]) -> int:
        """How many of ``blocks``' leading hashes were sent to ``replica``."""
        seen: Mapping[int, None] = self._blocks.get(replica, {})
        count = 0
        for block in blocks:
            if block not in seen:
                break
            count += 1
        return count

    def size(self, replica: str) -> int:
        """Block hashes remembered for ``replica``."""
        return len(self._blocks.get(replica, ()))

    def holds(self, replica: ReplicaView, model: str) -> bool:
        """Whether ``replica`` reported ``model`` resident or was sent it within the model memory."""
        sent = self._sent.get((replica.id, model))
        return model in replica.models or (sent is not None and self.clock() - sent <= self.model_memory_s)

    def models(self, replica: ReplicaView) -> frozenset[str]:
        """The models ``replica`` holds: reported, or sent within the model memory."""
        now = self.clock()
        sent = {m for (r, m), t in self._sent.items() if r == replica.id and now - t <= self.model_memory_s}
        return replica.models | sent

    def record(self, replica: str, key: RouteKey) -> None:
        """``key`` was sent to ``replica``: remember its blocks (most recent last) and its model."""
        seen = self._blocks.setdefault(replica, OrderedDict())
        for block in key.blocks:
            seen[block] = None
            seen.move_to_end(block)
        while len(seen) > self.capacity:
            seen.popitem(last=False)
        if key.model is not None:
            self._sent[(replica, key.model)] = self.clock()

    def forget(self, replica: str) -> None:
        """``replica`` is gone: drop what was remembered of it."""
        self._blocks.pop(replica, None)
        self._sent = {k: t for k, t in self._sent.items() if k[0] != replica}


def choose(
    replicas: Sequence[ReplicaView], key: RouteKey, book: RouteBook, bound: int = LOAD_BOUND
) -> list[ReplicaView]:
    """``replicas`` ranked for ``key``, the chosen one first (the module's docstring: the algorithm)."""
    if not replicas:
        return []
    least = min(r.load for r in replicas)
    holders = [r for r in replicas if key.model is not None and book.holds(r, key.model)]
    candidates = holders if holders and min(r.load for r in holders) - least <= bound else list(replicas)
    floor = min(r.load for r in candidates)

    def calm(r: ReplicaView) -> tuple[int, int, int, str]:
        models = len(book.models(r)) if not holders else 0
        return (r.load, models, book.size(r.id), r.id)

    ranked = sorted(candidates, key=calm)
    if key.blocks:
        matches = {r.id: book.match(r.id, key.blocks) for r in candidates}
        affine = min(candidates, key=lambda r: (-matches[r.id], r.load, r.id))
        if matches[affine.id] > MIN_MATCH * len(key.blocks) and affine.load - floor <= bound:
            ranked.remove(affine)
            ranked.insert(0, affine)
    rest = sorted((r for r in replicas if r not in candidates), key=calm)
    return ranked + rest


def round_robin(replicas: Sequence[ReplicaView], turn: int) -> list[ReplicaView]:
    """The fault ``route-round-robin`` (a negative control): the key ignored, replicas taken in turn."""
    ordered = sorted(replicas, key=lambda r: r.id)
    if not ordered:
        return []
    first = turn % len(ordered)
    return ordered[first:] + ordered[:first]
