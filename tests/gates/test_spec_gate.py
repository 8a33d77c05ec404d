"""Gate `spec`: GREEN as built; each negative control, blinded, turns it RED; the faults really change
outputs."""

from __future__ import annotations

import pytest

from gates.framework import run_gate
from gates.spec_gate import GATE


@pytest.mark.parametrize("blind", [None, "spec.neg.accept_wrong", "spec.neg.keep_rejected_kv"])
def test_spec_gate(blind: str | None) -> None:
    result = run_gate(GATE, blind={blind} if blind else ())
    failing = [r.check for r in result.rows if not r.ok]
    if blind is None:
        assert result.verdict == "GREEN", failing
        for neg in (r for r in result.rows if r.kind == "neg"):
            assert not neg.observed.startswith("0/")  # the fault really changes outputs
    else:
        assert result.verdict == "RED" and failing == [blind]
