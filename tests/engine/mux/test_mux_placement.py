"""Models placed across replicas (engine/mux/placement.py): a home for every model whenever a packing
exists (found where first fit fails), the others named with why, homes within every budget, traffic
favoured, and the replay's hit rate the sum of the replicas' own replays."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequestError
from engine.mux.placement import place_models, predict_hits
from engine.mux.registry import ModelSpec, Registry
from engine.mux.replay import replay
from engine.mux.trace import TraceRequest

GB = 1_000_000_000


def _packing_exists(sizes: dict[int, int], budgets: list[int]) -> bool:
    """Brute force: some assignment of every model to a replica within every budget."""
    models = list(sizes)
    for homes in itertools.product(range(len(budgets)), repeat=len(models)):
        used = [0] * len(budgets)
        for m, r in zip(models, homes, strict=True):
            used[r] += sizes[m]
        if all(u <= b for u, b in zip(used, budgets, strict=True)):
            return True
    return False


def test_a_packing_first_fit_misses_is_found():
    """5, 4, 4, 3, 2, 2 into two replicas of 10: largest-first first fit strands a 2 (5 + 4 | 4 + 3 + 2);
    5 + 3 + 2 | 4 + 4 + 2 holds every model."""
    sizes = dict(enumerate([5, 4, 4, 3, 2, 2]))
    placement = place_models(sizes, [10, 10])
    assert placement.complete and placement.exhaustive
    assert sorted(placement.bytes_on(r) for r in range(2)) == [10, 10]


def test_models_that_cannot_be_placed_are_named_with_the_reason():
    placement = place_models({0: 30, 1: 8, 2: 8, 3: 5}, [10, 12])
    assert not placement.complete
    assert "largest replica budget is" in placement.unplaced[0]
    assert set(placement.unplaced) == {0, 3}  # 8 | 8, or 8 | 5: two of the three; the more bytes win
    assert "no room left" in next(why for m, why in placement.unplaced.items() if m != 0)


def test_traffic_decides_who_goes_without_a_home():
    sizes = {0: 6, 1: 6, 2: 6}
    assert set(place_models(sizes, [12]).unplaced) == {2}  # one each: the largest ids lose ties
    assert set(place_models(sizes, [12], weights={0: 1, 1: 5, 2: 9}).unplaced) == {0}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=1, max_size=6),
    st.lists(st.integers(1, 30), min_size=1, max_size=3),
)
def test_homes_fit_every_budget_and_a_packing_is_found_whenever_one_exists(sizes, budgets):
    by_id = dict(enumerate(sizes))
    placement = place_models(by_id, budgets)
    for r, budget in enumerate(budgets):
        assert placement.bytes_on(r) <= budget
    assert set(placement.homes) | set(placement.unplaced) == set(by_id)
    assert placement.complete == _packing_exists(by_id, budgets)


def _registry() -> Registry:
    rates = {"prefill_tok_s": 1000.0, "decode_tok_s": 10.0}
    sizes = [GB, GB, 2 * GB, 5 * GB]
    return Registry(
        tuple(
            ModelSpec(i, n, size_bytes=s, **rates) for i, (n, s) in enumerate(zip("ABCD", sizes, strict=True))
        )
    )


def test_the_predicted_hit_rate_is_the_replicas_replays():
    registry = _registry()
    trace = [
        TraceRequest(0.5 * i, model, 100, 5) for i, model in enumerate([0, 1, 2, 0, 2, 1, 0, 3, 2, 0] * 3)
    ]
    budgets = [2 * GB, 3 * GB // 2]
    placement = place_models(registry.sizes(), budgets, weights={0: 12, 1: 6, 2: 9, 3: 3})
    assert placement.homes == {2: 0, 0: 1} and set(placement.unplaced) == {1, 3}  # B: less asked for than A
    assert placement.route(1) == 1  # B takes turns with A in the replica with room beside its homes
    rate, replays, refused = predict_hits(registry, trace, placement, load_gbps=1.0)
    assert refused == 3  # D fits no replica
    shares = {r: [t for t in trace if placement.route(t.model) == r] for r in range(2)}
    hits = sum(replay(registry, shares[r], budgets[r], "lru", 1.0).hits for r in range(2) if shares[r])
    assert rate == hits / len(trace)
    assert [p.result.requests if p.result else 0 for p in replays] == [len(shares[0]), len(shares[1])]
    whole = place_models(registry.sizes(), [9 * GB])
    assert whole.complete
    alone, _, _ = predict_hits(registry, trace, whole, load_gbps=1.0)
    assert alone == replay(registry, trace, 9 * GB, "lru", 1.0).hits / len(trace)


@pytest.mark.parametrize("budgets", [[], [0], [-1, 5]])
def test_bad_budgets_are_refused(budgets):
    with pytest.raises(InvalidRequestError):
        place_models({0: 1}, budgets)


def test_the_demo_registry_plans_from_the_command_line(tmp_path: Path):
    from typer.testing import CliRunner

    from nxctl.commands import mux

    runner = CliRunner()
    result = runner.invoke(mux.app, ["plan", "--replicas", "3", "--budget-mb", "12000"])
    assert result.exit_code == 0, result.output
    assert "3 replicas" in result.output and "no home: oversized" in result.output
    traced = runner.invoke(
        mux.app,
        ["plan", "--replicas", "2", "--budget-mb", "12000,8000", "--trace", "fixtures/traces/zipf.jsonl"],
    )
    assert traced.exit_code == 0 and "predicted hit rate" in traced.output
    for args, fragment in (
        (["plan", "--replicas", "2", "--budget-mb", "1,2,3"], "3 budgets for 2 replicas"),
        (["plan", "--replicas", "2", "--budget-mb", "100", "tiny"], "registry's"),
        (["plan", "--budget-mb", "100", "--trace", "x.jsonl"], "go with --replicas"),
        (["plan", "--replicas", "0", "--budget-mb", "100"], "at least 1"),
    ):
        bad = runner.invoke(mux.app, args)
        assert bad.exit_code != 0 and fragment in bad.stderr and "Traceback" not in bad.output, bad.stderr
