"""The residency simulator behind `nxctl mux run`: a request sequence, one at a time, under a budget.

Each request is served before the next arrives, so no model is ever busy when another needs room: every
request is a hit, a load (after its evictions) or a refusal, never a wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from engine.mux.plans import Hit, Load, Refuse
from engine.mux.policies import Policy, make_policy
from engine.mux.registry import Registry, mb
from engine.mux.residency import Counters, ResidencyError, ResidencyManager

Action = Literal["hit", "load", "refuse"]


@dataclass(frozen=True)
class Step:
    """One request of the sequence and what it did; ``resident`` is the state after it."""

    tick: int
    model: int
    action: Action
    evicted: tuple[int, ...]
    resident: tuple[int, ...]
    resident_bytes: int
    reason: str = ""


@dataclass(frozen=True)
class SimResult:
    policy: str
    budget_bytes: int
    sequence: tuple[int, ...]
    steps: tuple[Step, ...]
    counters: Counters

    @property
    def hits(self) -> int:
        return self.counters.hits

    @property
    def loads(self) -> int:
        return self.counters.loads

    @property
    def evicts(self) -> int:
        return self.counters.evicts

    @property
    def refused(self) -> int:
        return self.counters.refused

    @property
    def peak_bytes(self) -> int:
        return self.counters.peak_bytes

    @property
    def evicted(self) -> tuple[int, ...]:
        """Every eviction, in order."""
        return tuple(m for step in self.steps for m in step.evicted)

    @property
    def final_resident(self) -> tuple[int, ...]:
        return self.steps[-1].resident if self.steps else ()

    def to_json(self, names: Mapping[int, str] | None = None) -> dict[str, Any]:
        names = names or {}
        steps = [{**asdict(s), "name": names.get(s.model, str(s.model))} for s in self.steps]
        return {
            "policy": self.policy,
            "budget_mb": mb(self.budget_bytes),
            "sequence": list(self.sequence),
            "hits": self.hits,
            "loads": self.loads,
            "evicts": self.evicts,
            "refused": self.refused,
            "peak_mb": mb(self.peak_bytes),
            "peak_within_budget": self.peak_bytes <= self.budget_bytes,
            "final_resident": list(self.final_resident),
            "steps": steps,
        }


def simulate(
    sizes: Mapping[int, int],
    budget_bytes: int,
    sequence: Sequence[int],
    policy: Policy | str = "lru",
    pinned: frozenset[int] = frozenset(),
) -> SimResult:
    """Serve ``sequence`` (model ids) in order under ``budget_bytes``; ``policy`` is a name or an instance."""
    chosen = make_policy(policy, future=list(sequence)) if isinstance(policy, str) else policy
    manager = ResidencyManager(budget_bytes, sizes, chosen, pinned)
    steps = []
    for tick, model in enumerate(sequence):
        plan = manager.access(model, tick)
        action: Action
        evicted: tuple[int, ...]
        if isinstance(plan, Hit):
            action, evicted, reason = "hit", (), ""
        elif isinstance(plan, Load):
            action, evicted, reason = "load", plan.victims, ""
        elif isinstance(plan, Refuse):
            action, evicted, reason = "refuse", (), plan.reason
        else:
            raise ResidencyError(f"policy {chosen.name} made request {tick} wait with no model busy")
        steps.append(Step(tick, model, action, evicted, manager.resident, manager.resident_bytes, reason))
    counters = Counters(**asdict(manager.counters))
    return SimResult(chosen.name, manager.budget_bytes, tuple(sequence), tuple(steps), counters)


def simulate_registry(
    registry: Registry, budget_bytes: int, keys: Sequence[str | int], policy: Policy | str = "lru"
) -> SimResult:
    """``simulate`` over a registry, with requests given as ids or names."""
    sequence = registry.resolve_all(keys)
    sizes = {m: registry.size_bytes(m) for m in dict.fromkeys(sequence)}
    return simulate(sizes, budget_bytes, sequence, policy, registry.pinned() & set(sizes))
