"""The cluster gate: GREEN on a local Ray instance; RED when either negative control's detection is
switched off; and its checkers tell the broken evidence from the honest one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.cluster_gate import GATE, _resume_differs, landing_problems
from gates.framework import read_tsv, run_gate_and_blinded

pytest.importorskip("ray.serve")

NEGATIVES = ("cluster.neg.route_round_robin", "cluster.neg.resume_no_skip")


@pytest.mark.ray
def test_gate_is_green_and_blinded_is_red_exactly_at_its_controls(tmp_path: Path) -> None:
    """One run of the gate (two Ray seats), seen as built and with both controls blinded."""
    assert GATE.negatives == NEGATIVES
    result, blinded = run_gate_and_blinded(GATE, NEGATIVES, tmp_path)
    assert result.green, [r for r in result.rows if not r.ok]
    rows = read_tsv(tmp_path / "cluster.tsv")
    assert [r["check"] for r in rows] == list(GATE.checks)
    assert {r.check for r in blinded.rows if not r.ok} == set(NEGATIVES)


def test_the_checkers_catch_what_they_must() -> None:
    routed = [("alpha", "a"), ("alpha", "a"), ("beta", "b")]
    assert landing_problems(routed) == []
    assert landing_problems([("alpha", "a"), ("alpha", "b"), ("beta", "b")]) == ["alpha landed on 2 replicas"]
    assert landing_problems([("alpha", "a"), ("beta", "a")]) == ["alpha and beta share a replica"]
    whole = ("text", [1, 2], 1, 1, 7)
    assert not _resume_differs((whole, whole))
    assert _resume_differs((("text", [1, 2], 1, 2, 7), whole))  # the role announced twice
    assert _resume_differs((("tetext", [1, 1, 2], 1, 1, 7), whole))  # a head repeated
