"""The gate framework's negative controls: a detector must catch the broken input AND stay quiet on the
honest one, so a detector hard-wired to either answer turns its row RED in every gate run."""

from __future__ import annotations

from engine.outputs import RequestOutput
from gates.framework import Gate, GateRun, run_gate, run_gate_and_blinded
from gates.runs import any_differ


def _gate(detect) -> Gate:
    def body(run: GateRun) -> None:
        run.check("t.check", True, "x", "x")
        run.negative("t.neg", detect, broken=[1, 2, 9], honest=[1, 2, 3], observed="-")

    return Gate("t", "a toy gate", ("t.check", "t.neg"), body)


def _has_nine(values: list[int]) -> bool:
    return 9 in values


def test_a_real_detector_is_green() -> None:
    assert run_gate(_gate(_has_nine)).verdict == "GREEN"


def test_a_detector_hard_wired_to_caught_is_red_as_a_false_alarm() -> None:
    result = run_gate(_gate(lambda values: True))
    neg = next(r for r in result.rows if r.check == "t.neg")
    assert result.verdict == "RED" and not neg.ok and "FALSE ALARM" in neg.observed


def test_a_detector_hard_wired_to_not_caught_is_red() -> None:
    assert run_gate(_gate(lambda values: False)).verdict == "RED"


def test_a_blinded_detector_is_red() -> None:
    assert run_gate(_gate(_has_nine), blind={"t.neg"}).verdict == "RED"


def test_blinding_touches_only_the_blinded_rows() -> None:
    """Why a gate's tests blind all its controls in one run: each blinded row goes RED, no other does."""

    def body(run: GateRun) -> None:
        run.check("t.check", True, "x", "x")
        for name in ("a", "b", "c"):
            run.negative(f"t.neg.{name}", _has_nine, broken=[9], honest=[1], observed="-")

    gate = Gate("t", "a toy gate", ("t.check", "t.neg.a", "t.neg.b", "t.neg.c"), body)
    assert gate.negatives == ("t.neg.a", "t.neg.b", "t.neg.c")
    for blind in ({"t.neg.a"}, {"t.neg.a", "t.neg.c"}, set(gate.negatives)):
        result = run_gate(gate, blind=blind)
        assert {r.check for r in result.rows if not r.ok} == blind


def test_one_run_seen_blinded_equals_a_blinded_run(tmp_path) -> None:
    """``run_gate_and_blinded``: its first view is the gate as built (TSV written), its second exactly what
    ``run_gate(blind=...)`` gives, whichever controls are blinded and whether or not they fire."""

    def body(run: GateRun) -> None:
        run.check("t.check", True, "x", "x")
        run.negative("t.neg.a", _has_nine, broken=[9], honest=[1], observed="a")
        run.negative("t.neg.b", lambda values: False, broken=[9], honest=[1], observed="b", detail="d")
        run.negative("t.neg.c", lambda values: True, broken=[9], honest=[1], observed="c")

    gate = Gate("t", "a toy gate", ("t.check", "t.neg.a", "t.neg.b", "t.neg.c", "t.never"), body)
    for blind in (set(), {"t.neg.a"}, {"t.neg.b", "t.neg.c"}, set(gate.negatives)):
        as_built, blinded = run_gate_and_blinded(gate, blind, tmp_path)
        assert as_built.rows == run_gate(gate).rows
        assert blinded.rows == run_gate(gate, blind=blind).rows
        assert as_built.tsv_path == tmp_path / "t.tsv" and blinded.tsv_path is None
    assert {r.check for r in blinded.rows if not r.ok} == {"t.neg.a", "t.neg.b", "t.neg.c", "t.never"}


def _out(tokens: list[int], logprobs: list[float]) -> RequestOutput:
    return RequestOutput("r", [1], tokens, "", "length", logprobs=logprobs)


def test_the_invariance_detector_both_ways() -> None:
    a = _out([5, 6], [-0.5, -1.25])
    same_again = _out([5, 6], [-0.5, -1.25])
    one_bit_off = _out([5, 6], [-0.5, -1.2500001])
    other_token = _out([5, 7], [-0.5, -1.25])
    assert not any_differ(([a], [same_again]))
    assert any_differ(([a], [one_bit_off])) and any_differ(([a], [other_token]))
