"""Gate `share`: GREEN as built; its negative controls, blinded, turn exactly their rows RED."""

from __future__ import annotations

from gates.framework import run_gate_and_blinded
from gates.share_gate import GATE


def test_share_gate() -> None:
    """GREEN as built; blinded together (blinding touches only its own row), each control and nothing else
    goes RED. One run of the gate, seen both ways."""
    assert GATE.negatives == ("share.neg.last_block_key", "share.neg.fcfs")
    result, blinded = run_gate_and_blinded(GATE, GATE.negatives)
    assert result.verdict == "GREEN", [r.check for r in result.rows if not r.ok]
    assert blinded.verdict == "RED"
    assert {r.check for r in blinded.rows if not r.ok} == set(GATE.negatives)
