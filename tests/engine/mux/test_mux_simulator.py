"""The simulator on the demo registry: the gate's scenarios, the README example, and the oracle."""

from __future__ import annotations

import pytest

from engine.errors import UnknownModelError
from engine.mux.registry import MB, load_registry
from engine.mux.simulator import simulate, simulate_registry


@pytest.fixture(scope="module")
def demo():
    return load_registry()


@pytest.mark.parametrize(
    ("budget", "sequence", "expected"),
    [
        (14000, [0, 0, 1], {"loads": 2, "hits": 1, "evicts": 0, "refused": 0}),
        (11000, [0, 1, 0, 1], {"loads": 4, "hits": 0, "evicts": 3, "refused": 0}),
        (16000, [3], {"loads": 0, "hits": 0, "evicts": 0, "refused": 1}),
        (9000, [4, 5, 4, 6, 4], {"loads": 3, "hits": 2, "evicts": 1, "refused": 0}),
        (16000, [0, 2, 1, 0, 2], {"loads": 5, "hits": 0, "evicts": 4, "refused": 0}),
    ],
)
def test_demo_scenarios(demo, budget: int, sequence: list[int], expected: dict[str, int]) -> None:
    result = simulate_registry(demo, budget * MB, sequence)
    assert {k: getattr(result, k) for k in expected} == expected
    assert result.peak_bytes <= budget * MB


def test_lru_scenario_evicts_the_least_recently_used(demo) -> None:
    result = simulate_registry(demo, 9000 * MB, [4, 5, 4, 6, 4])
    assert result.evicted == (5,)
    assert result.final_resident == (4, 6)
    assert [s.action for s in result.steps] == ["load", "load", "hit", "load", "hit"]


def test_names_and_ids_mix(demo) -> None:
    by_name = simulate_registry(demo, 16000 * MB, ["zimage", "sdxl", "qwen-llm", "0", 2])
    by_id = simulate_registry(demo, 16000 * MB, [0, 2, 1, 0, 2])
    assert by_name.steps == by_id.steps


def test_refusal_reason_and_json(demo) -> None:
    result = simulate_registry(demo, 16000 * MB, [3, 1])
    assert result.steps[0].action == "refuse" and "needs 20000 MB" in result.steps[0].reason
    data = result.to_json({m.id: m.name for m in demo.models})
    assert data["refused"] == 1 and data["loads"] == 1 and data["peak_within_budget"]
    assert data["steps"][0]["name"] == "oversized"


def test_unknown_id_is_an_error(demo) -> None:
    with pytest.raises(UnknownModelError):
        simulate_registry(demo, 16000 * MB, [0, 9])


def test_oracle_beats_lru_on_a_scan() -> None:
    sizes = {m: MB for m in range(4)}
    sequence = [0, 1, 2, 3] * 5
    lru = simulate(sizes, 3 * MB, sequence, "lru")
    oracle = simulate(sizes, 3 * MB, sequence, "oracle")
    assert lru.hits == 0 and oracle.hits > lru.hits
    assert oracle.peak_bytes <= 3 * MB
