"""Gate `spec`: GREEN as built; its negative controls, blinded, turn exactly their rows RED; the faults really change
outputs."""

from __future__ import annotations

import pytest

from gates.framework import GateRun, run_gate_and_blinded
from gates.spec_gate import GATE, SpeculationTally


def test_spec_gate() -> None:
    """GREEN as built; blinded together (blinding touches only its own row), each control and nothing else
    goes RED. One run of the gate, seen both ways."""
    assert GATE.negatives == ("spec.neg.accept_wrong", "spec.neg.keep_rejected_kv")
    result, blinded = run_gate_and_blinded(GATE, GATE.negatives)
    assert result.verdict == "GREEN", [r.check for r in result.rows if not r.ok]
    for neg in (r for r in result.rows if r.kind == "neg"):
        assert not neg.observed.startswith("0/")  # the fault really changes outputs
    assert blinded.verdict == "RED"
    assert {r.check for r in blinded.rows if not r.ok} == set(GATE.negatives)


@pytest.mark.parametrize(
    "counts,ok",
    [
        ({"drafts": 0, "accepted": 0, "proposed": 0}, False),  # speculation never proposed
        ({"drafts": 3, "accepted": 0, "proposed": 9}, False),  # every proposal rejected
        ({"drafts": 3, "accepted": 9, "proposed": 9}, False),  # every proposal accepted
        ({"drafts": 3, "accepted": 4, "proposed": 9}, True),
        ({"drafts": 3, "accepted": 4, "proposed": 9, "differ": 1}, False),  # an output changed
    ],
)
def test_an_equality_check_is_red_without_both_accepted_and_rejected_proposals(counts, ok) -> None:
    """The equality says nothing unless speculation ran with both outcomes: the check is RED then, as
    when an output differs."""
    run = GateRun("spec")
    SpeculationTally(cases=16, batches=1, **counts).report(run, "spec.ngram_equal", "")
    assert [r.ok for r in run.rows] == [ok]
