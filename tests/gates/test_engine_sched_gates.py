"""The engine and sched gates: GREEN as built, RED when a negative control's detection is disabled."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.engine_gate import GATE as ENGINE_GATE
from gates.framework import read_tsv, run_gate
from gates.sched_gate import GATE as SCHED_GATE


def test_engine_gate_green_and_writes_tsv(tmp_path: Path) -> None:
    result = run_gate(ENGINE_GATE, tmp_path)
    assert result.verdict == "GREEN", [r for r in result.rows if not r.ok]
    rows = read_tsv(tmp_path / "engine.tsv")
    assert {r["check"] for r in rows} == set(ENGINE_GATE.checks)


@pytest.mark.parametrize("neg", ["engine.neg.perturbed_weight", "engine.neg.swapped_kv_block"])
def test_engine_gate_red_without_detection(neg: str) -> None:
    result = run_gate(ENGINE_GATE, blind={neg})
    assert result.verdict == "RED"
    assert [r.check for r in result.rows if not r.ok] == [neg]


@pytest.fixture(scope="module")
def sched_results() -> dict:
    return {
        "green": run_gate(SCHED_GATE),
        "blind_matmul": run_gate(SCHED_GATE, blind={"sched.neg.batch_dependent_matmul"}),
        "blind_seed": run_gate(SCHED_GATE, blind={"sched.neg.changed_seed"}),
    }


def test_sched_gate_green(sched_results: dict) -> None:
    result = sched_results["green"]
    assert result.verdict == "GREEN", [r for r in result.rows if not r.ok]


@pytest.mark.parametrize(
    ("key", "neg"),
    [("blind_matmul", "sched.neg.batch_dependent_matmul"), ("blind_seed", "sched.neg.changed_seed")],
)
def test_sched_gate_red_without_detection(sched_results: dict, key: str, neg: str) -> None:
    result = sched_results[key]
    assert result.verdict == "RED"
    assert [r.check for r in result.rows if not r.ok] == [neg]
