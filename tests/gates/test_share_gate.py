"""Gate `share`: GREEN as built; its negative controls, blinded, turn exactly their rows RED."""

from __future__ import annotations

import pytest

from gates.framework import run_gate
from gates.share_gate import GATE


@pytest.mark.parametrize("blind", [False, True])
def test_share_gate(blind: bool) -> None:
    """Blinded together (blinding touches only its own row): each control, and nothing else, goes RED."""
    assert GATE.negatives == ("share.neg.last_block_key", "share.neg.fcfs")
    result = run_gate(GATE, blind=GATE.negatives if blind else ())
    failing = [r.check for r in result.rows if not r.ok]
    if not blind:
        assert result.verdict == "GREEN", failing
    else:
        assert result.verdict == "RED" and set(failing) == set(GATE.negatives)
