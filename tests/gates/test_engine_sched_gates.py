"""The engine and sched gates: GREEN as built, RED when a negative control's detection is disabled."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.engine_gate import GATE as ENGINE_GATE
from gates.framework import read_tsv, run_gate, run_gate_and_blinded
from gates.sched_gate import GATE as SCHED_GATE


def test_engine_gate_green_and_writes_tsv(tmp_path: Path) -> None:
    result = run_gate(ENGINE_GATE, tmp_path)
    assert result.verdict == "GREEN", [r for r in result.rows if not r.ok]
    rows = read_tsv(tmp_path / "engine.tsv")
    assert {r["check"] for r in rows} == set(ENGINE_GATE.checks)


def test_engine_gate_red_without_detection() -> None:
    """Blinded together (blinding touches only its own row): each control, and nothing else, goes RED."""
    assert ENGINE_GATE.negatives == ("engine.neg.perturbed_weight", "engine.neg.swapped_kv_block")
    result = run_gate(ENGINE_GATE, blind=ENGINE_GATE.negatives)
    assert result.verdict == "RED"
    assert {r.check for r in result.rows if not r.ok} == set(ENGINE_GATE.negatives)


@pytest.fixture(scope="module")
def sched_results() -> dict:
    green, blind = run_gate_and_blinded(SCHED_GATE, SCHED_GATE.negatives)  # each touches only its own row
    return {"green": green, "blind": blind}


def test_sched_gate_green(sched_results: dict) -> None:
    result = sched_results["green"]
    assert result.verdict == "GREEN", [r for r in result.rows if not r.ok]


def test_sched_gate_red_without_detection(sched_results: dict) -> None:
    assert SCHED_GATE.negatives == ("sched.neg.batch_dependent_matmul", "sched.neg.changed_seed")
    result = sched_results["blind"]
    assert result.verdict == "RED"
    assert {r.check for r in result.rows if not r.ok} == set(SCHED_GATE.negatives)
