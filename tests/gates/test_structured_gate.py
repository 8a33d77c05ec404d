"""Gate `structured`: GREEN as built; its negative control, blinded, turns it RED; and the control
itself sees invalid output when the mask is off."""

from __future__ import annotations

from gates.framework import run_gate_and_blinded
from gates.structured_gate import GATE


def test_structured_gate() -> None:
    """GREEN as built; with its control blinded, that row and nothing else RED. One run, seen both ways."""
    result, blinded = run_gate_and_blinded(GATE, {"structured.neg.mask_off"})
    assert result.verdict == "GREEN", [r.check for r in result.rows if not r.ok]
    neg = next(r for r in result.rows if r.check == "structured.neg.mask_off")
    assert not neg.observed.startswith("0/")  # the mask off really breaks the output
    assert blinded.verdict == "RED"
    assert [r.check for r in blinded.rows if not r.ok] == ["structured.neg.mask_off"]
