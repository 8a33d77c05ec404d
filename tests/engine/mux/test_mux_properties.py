"""Property-based tests over random registries, budgets, sequences and traces, for every policy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.mux.plans import Load, Refuse, Wait
from engine.mux.policies import POLICIES, make_policy
from engine.mux.registry import MB, ModelSpec, Registry
from engine.mux.replay import replay
from engine.mux.residency import ResidencyManager
from engine.mux.simulator import simulate
from engine.mux.trace import TraceRequest

sizes_st = st.dictionaries(st.integers(0, 9), st.integers(1, 64), min_size=1, max_size=8)


@st.composite
def scenarios(draw: st.DrawFn, uniform: bool = False, pinning: bool = True):
    """(sizes in bytes, budget in bytes, sequence, pinned) with a sequence over the registry's ids."""
    sizes_mb = draw(sizes_st)
    if uniform:
        size = draw(st.integers(1, 64))
        sizes_mb = dict.fromkeys(sizes_mb, size)
    budget_mb = draw(st.integers(1, 160))
    sequence = draw(st.lists(st.sampled_from(sorted(sizes_mb)), min_size=1, max_size=60))
    pinned = (
        frozenset(draw(st.sets(st.sampled_from(sorted(sizes_mb)), max_size=2))) if pinning else frozenset()
    )
    return {m: s * MB for m, s in sizes_mb.items()}, budget_mb * MB, sequence, pinned


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(POLICIES))
def test_resident_bytes_never_exceed_the_budget(scenario, policy: str) -> None:
    sizes, budget, sequence, pinned = scenario
    result = simulate(sizes, budget, sequence, policy, pinned)
    assert result.peak_bytes <= budget
    for step in result.steps:
        assert step.resident_bytes == sum(sizes[m] for m in step.resident) <= budget
    assert result.hits + result.loads + result.refused == len(sequence)
    assert result.loads - result.evicts == len(result.final_resident)
    held: set[int] = set()
    for step in result.steps:  # once resident, a pinned model stays
        assert held <= set(step.resident)
        held |= pinned & set(step.resident)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(POLICIES))
def test_a_hit_never_changes_what_is_resident(scenario, policy: str) -> None:
    sizes, budget, sequence, pinned = scenario
    result = simulate(sizes, budget, sequence, policy, pinned)
    before: tuple[int, ...] = ()
    for step in result.steps:
        if step.action == "hit":
            assert step.resident == before and step.model in before and not step.evicted
        if step.action == "refuse":
            assert step.resident == before
        before = step.resident


@settings(max_examples=300, deadline=None)
@given(scenarios(uniform=True, pinning=False))
def test_oracle_hits_at_least_lru_on_uniform_sizes(scenario) -> None:
    sizes, budget, sequence, _ = scenario
    oracle = simulate(sizes, budget, sequence, "oracle")
    for other in ("lru", "lfu", "gdsf"):
        assert oracle.hits >= simulate(sizes, budget, sequence, other).hits


ops_st = st.lists(
    st.tuples(st.sampled_from(["access", "acquire", "release"]), st.integers(0, 9)), max_size=80
)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(["lru", "lfu", "gdsf"]), ops_st)
def test_busy_models_are_never_evicted(scenario, policy: str, ops) -> None:
    sizes, budget, _, pinned = scenario
    manager = ResidencyManager(budget, sizes, make_policy(policy), pinned)
    busy: dict[int, int] = {}
    for tick, (op, raw) in enumerate(ops):
        model = sorted(sizes)[raw % len(sizes)]
        if op == "access":
            resident_before = set(manager.resident)
            plan = manager.access(model, tick)
            if isinstance(plan, Load):
                assert not set(plan.victims) & {m for m, n in busy.items() if n}
                assert not set(plan.victims) & pinned
            if isinstance(plan, Wait):
                assert set(manager.resident) == resident_before and any(busy.values())
            if isinstance(plan, Refuse):
                assert set(manager.resident) == resident_before
        elif op == "acquire" and manager.is_resident(model):
            manager.acquire(model)
            busy[model] = busy.get(model, 0) + 1
        elif op == "release" and busy.get(model):
            manager.release(model)
            busy[model] -= 1
        assert manager.resident_bytes <= budget
        assert all(manager.is_resident(m) for m, n in busy.items() if n)


trace_st = st.lists(
    st.tuples(
        st.floats(0, 100, allow_nan=False), st.integers(0, 9), st.integers(0, 2000), st.integers(1, 300)
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.sampled_from(POLICIES), trace_st, st.floats(0.05, 20))
def test_replay_keeps_the_budget_and_serves_every_request(
    scenario, policy: str, raw_trace, gbps: float
) -> None:
    sizes, budget, _, pinned = scenario
    ids = sorted(sizes)
    registry = Registry(
        tuple(ModelSpec(m, f"m{m}", size_bytes=sizes[m], pinned=m in pinned, decode_tok_s=50.0) for m in ids)
    )
    trace = sorted(
        (TraceRequest(t, ids[raw % len(ids)], p, o) for t, raw, p, o in raw_trace), key=lambda r: r.t
    )
    result = replay(registry, trace, budget, policy, gbps)
    assert result.peak_bytes <= budget
    assert 0 <= result.hits + result.refused <= result.requests == len(trace)
    assert result.stall_s >= 0 and result.makespan_s >= trace[-1].t
    never_fit = sum(1 for r in trace if sizes[r.model] > budget)
    assert result.refused >= never_fit
