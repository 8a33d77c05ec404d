"""`nxctl gate` through Typer's CliRunner: its exit status follows the verdicts, its TSVs are written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gates.framework import Gate, GateRun, read_tsv
from nxctl.cli import app
from nxctl.commands import gate as gate_command

runner = CliRunner()


def _toy(name: str, holds: bool) -> Gate:
    def body(run: GateRun) -> None:
        run.check(f"{name}.check", holds, "holds", "holds" if holds else "broken")

    return Gate(name, "a toy gate", (f"{name}.check",), body)


@pytest.mark.parametrize(("holds", "exit_code"), [(True, 0), (False, 1)])
def test_exit_status_follows_the_verdict(monkeypatch, tmp_path: Path, holds: bool, exit_code: int) -> None:
    monkeypatch.setattr(gate_command, "select", lambda names: [_toy("toy", holds)])
    result = runner.invoke(app, ["gate", "toy", "--status-dir", str(tmp_path)])
    assert result.exit_code == exit_code, result.output
    verdict = "GREEN" if holds else "RED"
    assert f"toy VERDICT {verdict}" in result.stdout
    assert [r["verdict"] for r in read_tsv(tmp_path / "toy.tsv")] == [verdict]
    if not holds:
        assert "RED gates: toy" in result.stderr


def test_one_red_gate_among_green_ones_fails_the_run(monkeypatch, tmp_path: Path) -> None:
    gates = [_toy("a", True), _toy("b", False), _toy("c", True)]
    monkeypatch.setattr(gate_command, "select", lambda names: gates)
    result = runner.invoke(app, ["gate", "--status-dir", str(tmp_path)])
    assert result.exit_code == 1 and "RED gates: b" in result.stderr


def test_a_real_gate_runs_green(tmp_path: Path) -> None:
    result = runner.invoke(app, ["gate", "mux", "--status-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "mux VERDICT GREEN" in result.stdout and (tmp_path / "mux.tsv").is_file()


def test_unknown_gate_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["gate", "nope", "--status-dir", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "unknown gate nope" in result.stderr
