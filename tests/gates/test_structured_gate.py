"""Gate `structured`: GREEN as built; its negative control, blinded, turns it RED; and the control
itself sees invalid output when the mask is off."""

from __future__ import annotations

import pytest

from gates.framework import run_gate
from gates.structured_gate import GATE


@pytest.mark.parametrize("blind", [None, "structured.neg.mask_off"])
def test_structured_gate(blind: str | None) -> None:
    result = run_gate(GATE, blind={blind} if blind else ())
    failing = [r.check for r in result.rows if not r.ok]
    if blind is None:
        assert result.verdict == "GREEN", failing
        neg = next(r for r in result.rows if r.check == "structured.neg.mask_off")
        assert not neg.observed.startswith("0/")  # the mask off really breaks the output
    else:
        assert result.verdict == "RED" and failing == [blind]
