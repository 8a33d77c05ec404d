"""Gate `share`: GREEN as built; each negative control, blinded, turns it RED."""

from __future__ import annotations

import pytest

from gates.framework import run_gate
from gates.share_gate import GATE


@pytest.mark.parametrize("blind", [None, "share.neg.last_block_key", "share.neg.fcfs"])
def test_share_gate(blind: str | None) -> None:
    result = run_gate(GATE, blind={blind} if blind else ())
    failing = [r.check for r in result.rows if not r.ok]
    if blind is None:
        assert result.verdict == "GREEN", failing
    else:
        assert result.verdict == "RED" and failing == [blind]
