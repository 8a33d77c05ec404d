"""The residency manager: which models are resident under a byte budget, which are busy, and the counters.

Pure bookkeeping, no I/O: the simulator, the replay and the live ModelPool all drive the same manager.
Check is separate from act: ``plan`` asks the policy and mutates nothing; ``hit`` / ``evict`` / ``admit`` /
``refuse`` (or ``apply(plan)``) mutate, so a live pool can unload each victim for real before it records it.

Invariants:
- ``resident_bytes`` is the sum of the resident models' sizes; ``peak_bytes`` is its maximum so far;
- a busy model (acquired and not yet released) or a pinned one is never evicted: ``evict`` raises;
- the budget is kept by the plan: every built-in policy plans only loads that fit. The manager records
  rather than enforces it (``peak_bytes``, ``over_budget``) so that a broken policy shows up in the
  gate's budget check instead of being silently masked here. The live ModelPool, where an overrun
  would be real memory, refuses such a plan itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import InvalidRequestError, NxError, UnknownModelError
from engine.mux.plans import Hit, Load, Plan, Refuse, ResidencyView, Wait
from engine.mux.policies import Policy


class ResidencyError(NxError, RuntimeError):
    """A mutation that would break an invariant: evicting a busy or pinned model, loading one twice, ..."""


@dataclass
class Counters:
    """What a run did. ``peak_bytes`` is the most ever resident at once."""

    hits: int = 0
    loads: int = 0
    evicts: int = 0
    refused: int = 0
    peak_bytes: int = 0


class ResidencyManager:
    """Tracks residency under ``budget_bytes`` for the models in ``sizes`` (id -> bytes)."""

    def __init__(
        self,
        budget_bytes: int,
        sizes: Mapping[int, int],
        policy: Policy,
        pinned: frozenset[int] = frozenset(),
    ) -> None:
        if budget_bytes <= 0:
            raise InvalidRequestError(f"the memory budget must be positive, got {budget_bytes} bytes")
        self.budget_bytes = int(budget_bytes)
        self.sizes: dict[int, int] = dict(sizes)
        self.policy = policy
        self.pinned = frozenset(pinned)
        self.counters = Counters()
        self.over_budget = False
        self._resident: dict[int, int] = {}
        self._busy: dict[int, int] = {}

    # ---- read-only state -------------------------------------------------------------------------
    @property
    def resident(self) -> tuple[int, ...]:
        """Resident models, in load order."""
        return tuple(self._resident)

    @property
    def resident_bytes(self) -> int:
        return sum(self._resident.values())

    def is_resident(self, model: int) -> bool:
        return model in self._resident

    def is_busy(self, model: int) -> bool:
        return self._busy.get(model, 0) > 0

    def evictable(self) -> tuple[int, ...]:
        """Resident models that are neither busy nor pinned, in load order."""
        return tuple(m for m in self._resident if not self.is_busy(m) and m not in self.pinned)

    def view(self) -> ResidencyView:
        pinned_bytes = sum(size for m, size in self._resident.items() if m in self.pinned)
        busy = tuple(m for m in self._resident if self.is_busy(m))
        return ResidencyView(
            self.budget_bytes, self.sizes, dict(self._resident), self.evictable(), pinned_bytes, busy
        )

    # ---- check ------------------------------------------------------------------------------------
    def plan(self, model: int, tick: int) -> Plan:
        """The policy's plan for serving ``model`` now. Mutates nothing."""
        self._known(model)
        return self.policy.plan(model, self.view(), tick)

    # ---- act ----------------------------------------------------------------------------------------
    def hit(self, model: int, tick: int) -> None:
        """Count a request served by a resident model; residency does not change."""
        if model not in self._resident:
            raise ResidencyError(f"model {model} is not resident: not a hit")
        self.counters.hits += 1
        self.policy.on_hit(model, tick)

    def touch(self, model: int, tick: int) -> None:
        """A request that waited for ``model``'s load: bookkeeping for the policy, not a hit."""
        if model not in self._resident:
            raise ResidencyError(f"model {model} is not resident")
        self.policy.on_hit(model, tick)

    def evict(self, model: int) -> None:
        if model not in self._resident:
            raise ResidencyError(f"model {model} is not resident: cannot evict it")
        if self.is_busy(model):
            raise ResidencyError(f"model {model} is serving requests: it cannot be evicted")
        if model in self.pinned:
            raise ResidencyError(f"model {model} is pinned: it cannot be evicted")
        del self._resident[model]
        self.counters.evicts += 1
        self.policy.on_evict(model)

    def admit(self, model: int, tick: int) -> None:
        """Record ``model`` as loaded (its bytes now count)."""
        self._known(model)
        if model in self._resident:
            raise ResidencyError(f"model {model} is already resident")
        self._resident[model] = self.sizes[model]
        self.counters.loads += 1
        total = self.resident_bytes
        self.counters.peak_bytes = max(self.counters.peak_bytes, total)
        self.over_budget = self.over_budget or total > self.budget_bytes
        self.policy.on_load(model, self.sizes[model], tick)

    def abandon_load(self, model: int) -> None:
        """A load that was admitted and held failed: drop the hold, then undo the admission."""
        self.release(model)
        self.cancel_load(model)

    def cancel_load(self, model: int) -> None:
        """Undo ``admit`` for a load that failed: the model leaves, uncounted as a load or an eviction.
        It must not be busy (release the hold taken for the load first)."""
        if model not in self._resident or self.is_busy(model):
            raise ResidencyError(f"model {model} is not an idle resident model: cannot cancel its load")
        del self._resident[model]
        self.counters.loads -= 1
        self.policy.on_evict(model)

    def refuse(self, model: int) -> None:
        self.counters.refused += 1

    def apply(self, plan: Plan) -> None:
        """Carry out a Hit / Load / Refuse plan (evicting Load's victims first). A Wait changes nothing."""
        if isinstance(plan, Hit):
            self.hit(plan.model, plan.tick)
        elif isinstance(plan, Load):
            for victim in plan.victims:
                self.evict(victim)
            self.admit(plan.model, plan.tick)
        elif isinstance(plan, Refuse):
            self.refuse(plan.model)
        elif not isinstance(plan, Wait):
            raise ResidencyError(f"not a plan: {plan!r}")

    def access(self, model: int, tick: int) -> Plan:
        """Plan and apply in one step (the simulator's request); returns the plan carried out."""
        plan = self.plan(model, tick)
        self.apply(plan)
        return plan

    def acquire(self, model: int) -> None:
        """Mark a resident model busy (serving one more request): it cannot be evicted until released."""
        if model not in self._resident:
            raise ResidencyError(f"model {model} is not resident: cannot acquire it")
        self._busy[model] = self._busy.get(model, 0) + 1

    def release(self, model: int) -> None:
        if not self.is_busy(model):
            raise ResidencyError(f"model {model} is not busy: release without acquire")
        self._busy[model] -= 1
        if not self._busy[model]:
            del self._busy[model]

    def _known(self, model: int) -> None:
        if model not in self.sizes:
            raise UnknownModelError(f"unknown model id {model}")
