"""The `mux` gate: the residency manager's counters on the demo registry, against fixed expected values.

Checks (budgets in MB, sequences of demo-registry ids):
- mux.registry_sizes     the demo registry's sizes are 0:10900 1:3000 2:6000 3:20000 4:4000 5:4000 6:4000
- mux.hit                14000, [0,0,1]: loads 2, hits 1, evicts 0
- mux.evict_cycle        11000, [0,1,0,1]: loads 4, evicts 3, hits 0
- mux.refuse_oversized   16000, [3]: refused 1, loads 0
- mux.lru                9000, [4,5,4,6,4]: hits 2, loads 3, evicts 1, evicted [5], 4 still resident
- mux.budget             on every run above, peak <= budget

Negative controls: the same checks run with a deliberately broken policy, injected through the public
Policy interface; each is caught when its check fails on that policy.
- mux.neg.mru                  an MRU policy (evicts the most recently used) must fail mux.lru;
- mux.neg.force_load_refusal   a policy that force-loads models larger than the budget must fail
                               mux.refuse_oversized;
- mux.neg.force_load_budget    ... and must fail mux.budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from engine.mux.plans import Load, Plan, ResidencyView
from engine.mux.policies import LRU, Policy
from engine.mux.registry import MB, Registry, load_registry, mb
from engine.mux.simulator import SimResult, simulate_registry
from gates.framework import Gate, GateRun

DEMO_FILE = "fixtures/mux-demo.toml"
EXPECTED_SIZES_MB = {0: 10900, 1: 3000, 2: 6000, 3: 20000, 4: 4000, 5: 4000, 6: 4000}

PolicyFactory = Callable[[], Policy]


class MostRecentlyUsed(Policy):
    """Broken on purpose: evicts the most recently used idle model (the negative control for mux.lru)."""

    name: ClassVar[str] = "mru"

    def victim(self, candidates: Sequence[int], tick: int) -> int:
        return max(candidates, key=lambda m: (self._recency(m), m))


class ForceLoad(LRU):
    """Broken on purpose: loads a model that can never fit instead of refusing it (evicting every idle
    model first), so the budget is overrun (the negative control for mux.refuse_oversized and mux.budget)."""

    name: ClassVar[str] = "force-load"

    def plan(self, model: int, view: ResidencyView, tick: int) -> Plan:
        if model not in view.resident and view.never_fits_reason(model) is not None:
            return Load(model, tick, view.evictable)
        return super().plan(model, view, tick)


def _run(registry: Registry, budget_mb: int, sequence: list[int], policy: PolicyFactory) -> SimResult:
    return simulate_registry(registry, budget_mb * MB, sequence, policy())


def _counts(result: SimResult, *keys: str) -> dict[str, object]:
    return {k: getattr(result, k) for k in keys}


def check_hit(registry: Registry, policy: PolicyFactory) -> tuple[bool, str, str, SimResult]:
    result = _run(registry, 14000, [0, 0, 1], policy)
    seen = _counts(result, "loads", "hits", "evicts")
    return seen == {"loads": 2, "hits": 1, "evicts": 0}, "loads 2 hits 1 evicts 0", _fmt(seen), result


def check_evict_cycle(registry: Registry, policy: PolicyFactory) -> tuple[bool, str, str, SimResult]:
    result = _run(registry, 11000, [0, 1, 0, 1], policy)
    seen = _counts(result, "loads", "evicts", "hits")
    return seen == {"loads": 4, "evicts": 3, "hits": 0}, "loads 4 evicts 3 hits 0", _fmt(seen), result


def check_refusal(registry: Registry, policy: PolicyFactory) -> tuple[bool, str, str, SimResult]:
    result = _run(registry, 16000, [3], policy)
    seen = _counts(result, "refused", "loads")
    return seen == {"refused": 1, "loads": 0}, "refused 1 loads 0", _fmt(seen), result


def check_lru(registry: Registry, policy: PolicyFactory) -> tuple[bool, str, str, SimResult]:
    result = _run(registry, 9000, [4, 5, 4, 6, 4], policy)
    seen = {**_counts(result, "hits", "loads", "evicts", "evicted"), "resident": result.final_resident}
    ok = _counts(result, "hits", "loads", "evicts", "evicted") == {
        "hits": 2,
        "loads": 3,
        "evicts": 1,
        "evicted": (5,),
    }
    return (
        ok and 4 in result.final_resident,
        "hits 2 loads 3 evicts 1 evicted (5,) 4 resident",
        _fmt(seen),
        result,
    )


def check_budget(results: Sequence[SimResult]) -> tuple[bool, str, str]:
    over = [
        f"{mb(r.peak_bytes):.0f}>{mb(r.budget_bytes):.0f}" for r in results if r.peak_bytes > r.budget_bytes
    ]
    peaks = ", ".join(f"{mb(r.peak_bytes):.0f}/{mb(r.budget_bytes):.0f}" for r in results)
    return (
        not over,
        "peak <= budget on every run",
        f"over: {', '.join(over)}" if over else f"peak/budget {peaks}",
    )


def _fmt(values: dict[str, object]) -> str:
    return " ".join(f"{k} {v}" for k, v in values.items())


def body(run: GateRun) -> None:
    registry = load_registry()
    sizes = {m: round(mb(b)) for m, b in registry.sizes().items()}
    run.check("mux.registry_sizes", sizes == EXPECTED_SIZES_MB, EXPECTED_SIZES_MB, sizes, DEMO_FILE)

    honest = {}
    for check_id, check in (
        ("mux.hit", check_hit),
        ("mux.evict_cycle", check_evict_cycle),
        ("mux.refuse_oversized", check_refusal),
        ("mux.lru", check_lru),
    ):
        honest[check_id] = outcome = check(registry, LRU)
        ok, expected, observed, _ = outcome
        run.check(check_id, ok, expected, observed, "policy lru")
    results = [outcome[3] for outcome in honest.values()]
    honest_budget = check_budget(results)
    ok, expected, observed = honest_budget
    run.check("mux.budget", ok, expected, observed, f"{len(results)} runs, policy lru")

    # each negative control runs the same check function on a broken policy (broken) and on LRU (honest)
    mru = check_lru(registry, MostRecentlyUsed)
    run.negative("mux.neg.mru", _failed, mru, honest["mux.lru"], mru[2], "mux.lru run with an MRU policy")
    forced = check_refusal(registry, ForceLoad)
    run.negative(
        "mux.neg.force_load_refusal",
        _failed,
        forced,
        honest["mux.refuse_oversized"],
        forced[2],
        "mux.refuse_oversized with force-load",
    )
    forced_runs = [forced[3]] + [
        check(registry, ForceLoad)[3] for check in (check_hit, check_evict_cycle, check_lru)
    ]
    budget = check_budget(forced_runs)
    run.negative(
        "mux.neg.force_load_budget", _failed, budget, honest_budget, budget[2], "mux.budget with force-load"
    )


def _failed(outcome: tuple[object, ...]) -> bool:
    """A mux check's outcome (ok, expected, observed, ...) as a detector: the check failed."""
    return not outcome[0]


GATE = Gate(
    name="mux",
    summary="residency under a memory budget: hits, evictions, LRU order, refusals, peak <= budget",
    checks=(
        "mux.registry_sizes",
        "mux.hit",
        "mux.evict_cycle",
        "mux.refuse_oversized",
        "mux.lru",
        "mux.budget",
        "mux.neg.mru",
        "mux.neg.force_load_refusal",
        "mux.neg.force_load_budget",
    ),
    body=body,
)
