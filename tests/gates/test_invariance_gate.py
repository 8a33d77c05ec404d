"""The invariance gate: GREEN as built, each negative control really fires, RED when one is not caught;
the CPU matrix's bookkeeping (cells, thread comparison)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates import matrix
from gates.framework import read_tsv, run_gate_and_blinded
from gates.invariance_gate import ENGINE_CASES, GATE
from gates.seed import gate_seed

NEGATIVES = ("invariance.neg.batch_dependent_matmul", "invariance.neg.batch_dependent_norm")


@pytest.fixture(scope="module")
def green(tmp_path_factory: pytest.TempPathFactory):
    """One gate run, seen as built and with both negative controls blinded."""
    status = tmp_path_factory.mktemp("status")
    as_built, blinded = run_gate_and_blinded(GATE, NEGATIVES, status)
    return as_built, status, blinded


def test_invariance_gate_green_with_seed_and_digest_in_every_row(green) -> None:
    result, status, _ = green
    assert result.verdict == "GREEN", [r for r in result.rows if not r.ok]
    rows = {r["check"]: r for r in read_tsv(status / "invariance.tsv")}
    assert set(rows) == set(GATE.checks)
    for check in ENGINE_CASES:
        assert f"seed {gate_seed()};" in rows[check]["detail"] and "digest " in rows[check]["detail"]


def test_each_negative_control_fires(green) -> None:
    result, _, _ = green
    fired = {r.check: r for r in result.rows if r.kind == "neg"}
    for neg in NEGATIVES:  # caught means the detector saw requests differ under the fault
        assert fired[neg].ok and not fired[neg].observed.startswith("0/"), fired[neg]


def test_gate_red_when_a_negative_control_is_not_caught(green) -> None:
    """Blinded together (blinding touches only its own row): each control, and nothing else, goes RED."""
    assert GATE.negatives == NEGATIVES
    _, _, result = green
    assert result.verdict == "RED"
    assert {r.check for r in result.rows if not r.ok} == set(NEGATIVES)


def test_matrix_compares_digests_across_thread_counts(monkeypatch, tmp_path: Path) -> None:
    def fake_cell(cell, threads, seed, status_dir):
        digest = "aaa" if threads == 1 or cell == "default" else "bbb"
        row = matrix.Row(f"matrix.{cell}.t{threads}", "check", True, "GREEN", "GREEN")
        return row, {c: digest for c in ENGINE_CASES}

    monkeypatch.setattr(matrix, "run_cell", fake_cell)
    rows = {r.check: r for r in matrix.run_matrix(["default", "avx2"], 0, tmp_path)}
    assert rows["matrix.default.threads"].ok
    assert not rows["matrix.avx2.threads"].ok
    assert (tmp_path / "matrix.tsv").exists()


def test_unknown_cell_is_refused() -> None:
    with pytest.raises(matrix.UnknownCellError, match="known cells"):
        matrix.select_cells(["sparc"])
