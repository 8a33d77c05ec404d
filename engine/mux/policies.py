"""Eviction policies: which idle resident model goes when a load needs room.

The public interface is ``Policy``: the manager tells it about hits, loads and evictions (``on_*``, which
mutate only the policy's own bookkeeping) and asks it for a ``plan`` (which mutates nothing). The default
``plan`` is the same for every policy and keeps the budget:

    if M is resident:                              Hit
    if M > budget - pinned bytes:                  Refuse (it can never fit)
    while M does not fit in what is free:
        no idle, unpinned model left?              Wait (busy models hold the room)
        v = victim(idle unpinned models); free += size(v)
    Load(M, victims)

Policies differ only in ``victim``. Ticks are logical clocks (the request's position in its sequence),
increasing; ``victim`` must return one of its candidates and must not mutate.

- ``lru``: least recently used.
- ``lfu``: fewest uses over the whole history (evicted models keep their counts); ties: least recent.
- ``gdsf``: Greedy-Dual-Size-Frequency with unit cost: priority L + uses / size_MB, the smallest goes and
  sets L; favours small, popular models (maximises hit count, not bytes).
- ``oracle``: Belady's choice, the model whose next request lies furthest ahead; needs the future, so it
  is a yardstick for replays, never a live policy.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from engine.errors import InvalidRequestError
from engine.mux.plans import Hit, Load, Plan, Refuse, ResidencyView, Wait
from engine.mux.registry import mb

POLICIES: tuple[str, ...] = ("lru", "lfu", "gdsf", "oracle")


class Policy(ABC):
    """The eviction policy interface. Subclass it and implement ``victim``; override ``plan`` only to change
    how loads are admitted (the gate's negative controls do exactly that, to prove its checks bite)."""

    name: ClassVar[str] = "policy"

    def __init__(self) -> None:
        self.last_use: dict[int, int] = {}

    def on_hit(self, model: int, tick: int) -> None:
        """A request for a resident model (mutates bookkeeping only)."""
        self.last_use[model] = tick

    def on_load(self, model: int, size: int, tick: int) -> None:
        """``model`` became resident (mutates bookkeeping only)."""
        self.last_use[model] = tick

    def on_evict(self, model: int) -> None:  # noqa: B027 - a hook: most policies keep nothing per resident
        """``model`` left the residency set (mutates bookkeeping only)."""

    @abstractmethod
    def victim(self, candidates: Sequence[int], tick: int) -> int:
        """One of ``candidates`` (idle, unpinned, resident) to evict next. Pure: mutates nothing."""

    def plan(self, model: int, view: ResidencyView, tick: int) -> Plan:
        """What to do to serve ``model`` now (see the module docstring). Pure: mutates nothing."""
        if model in view.resident:
            return Hit(model, tick)
        reason = view.never_fits_reason(model)
        if reason is not None:
            return Refuse(model, tick, reason)
        need, free = view.sizes[model], view.free_bytes
        candidates, victims = list(view.evictable), []
        while free < need:
            if not candidates:
                busy = ", ".join(str(b) for b in view.busy)
                return Wait(
                    model,
                    tick,
                    f"needs {mb(need):.0f} MB; {mb(free):.0f} MB free once idle models go; busy: {busy}",
                )
            chosen = self.victim(tuple(candidates), tick)
            candidates.remove(chosen)
            victims.append(chosen)
            free += view.resident[chosen]
        return Load(model, tick, tuple(victims))

    def _recency(self, model: int) -> int:
        return self.last_use.get(model, -1)


class LRU(Policy):
    name: ClassVar[str] = "lru"

    def victim(self, candidates: Sequence[int], tick: int) -> int:
        return min(candidates, key=lambda m: (self._recency(m), m))


class LFU(Policy):
    name: ClassVar[str] = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self.uses: dict[int, int] = {}

    def on_hit(self, model: int, tick: int) -> None:
        super().on_hit(model, tick)
        self.uses[model] = self.uses.get(model, 0) + 1

    def on_load(self, model: int, size: int, tick: int) -> None:
        super().on_load(model, size, tick)
        self.uses[model] = self.uses.get(model, 0) + 1

    def victim(self, candidates: Sequence[int], tick: int) -> int:
        return min(candidates, key=lambda m: (self.uses.get(m, 0), self._recency(m), m))


class GDSF(Policy):
    name: ClassVar[str] = "gdsf"

    def __init__(self) -> None:
        super().__init__()
        self.inflation = 0.0
        self.freq: dict[int, int] = {}
        self.size_mb: dict[int, float] = {}
        self.priority: dict[int, float] = {}

    def _reprioritise(self, model: int) -> None:
        self.priority[model] = self.inflation + self.freq[model] / self.size_mb[model]

    def on_hit(self, model: int, tick: int) -> None:
        super().on_hit(model, tick)
        self.freq[model] = self.freq.get(model, 0) + 1
        if model in self.size_mb:
            self._reprioritise(model)

    def on_load(self, model: int, size: int, tick: int) -> None:
        super().on_load(model, size, tick)
        self.freq[model], self.size_mb[model] = 1, mb(size)
        self._reprioritise(model)

    def on_evict(self, model: int) -> None:
        self.inflation = max(self.inflation, self.priority.pop(model, self.inflation))
        self.freq.pop(model, None)
        self.size_mb.pop(model, None)

    def victim(self, candidates: Sequence[int], tick: int) -> int:
        return min(candidates, key=lambda m: (self.priority.get(m, self.inflation), self._recency(m), m))


class Oracle(Policy):
    """Belady: evict the candidate whose next request (strictly after ``tick``) lies furthest ahead.

    ``future`` is the whole request sequence, indexed by tick; a model never requested again goes first.
    """

    name: ClassVar[str] = "oracle"

    def __init__(self, future: Sequence[int]) -> None:
        super().__init__()
        self.positions: dict[int, list[int]] = {}
        for index, model in enumerate(future):
            self.positions.setdefault(model, []).append(index)
        self.horizon = len(future)

    def next_use(self, model: int, tick: int) -> int:
        """The first tick after ``tick`` at which ``model`` is requested; past the horizon if never."""
        ticks = self.positions.get(model, [])
        at = bisect.bisect_right(ticks, tick)
        return ticks[at] if at < len(ticks) else self.horizon + 1

    def victim(self, candidates: Sequence[int], tick: int) -> int:
        return max(candidates, key=lambda m: (self.next_use(m, tick), -self._recency(m), -m))


def make_policy(name: str, future: Sequence[int] | None = None) -> Policy:
    """A fresh policy by name; ``oracle`` needs the request sequence (``future``)."""
    key = name.strip().lower()
    if key == "lru":
        return LRU()
    if key == "lfu":
        return LFU()
    if key == "gdsf":
        return GDSF()
    if key == "oracle":
        if future is None:
            raise InvalidRequestError("the oracle policy needs the future request sequence (replays only)")
        return Oracle(future)
    raise InvalidRequestError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


def parse_policies(text: str) -> list[str]:
    """'lru,gdsf' -> ['lru', 'gdsf'], each checked; InvalidRequestError on an unknown or empty list."""
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names:
        raise InvalidRequestError("no policy given; choose from " + ", ".join(POLICIES))
    for name in names:
        if name not in POLICIES:
            raise InvalidRequestError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


# the plan types are re-exported: a subclass overriding ``plan`` returns them
__all__ = [
    "GDSF",
    "LFU",
    "LRU",
    "POLICIES",
    "Hit",
    "Load",
    "Oracle",
    "Plan",
    "Policy",
    "Refuse",
    "Wait",
    "make_policy",
    "parse_policies",
]
