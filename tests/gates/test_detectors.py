"""Each gate's negative-control detector on hand-made evidence: quiet on the honest input, firing on the
broken one (the gates run them both ways too, on real runs)."""

from __future__ import annotations

from gates.engine_gate import _disagrees
from gates.mux_gate import _failed
from gates.share_gate import _unfair


def test_fairness_detector() -> None:
    assert not _unfair({"heavy": 50.0, "light": 48.0})
    assert _unfair({"heavy": 90.0, "light": 10.0})
    assert _unfair({"heavy": 0.0, "light": 0.0})  # nobody served: not fair either


def test_reference_detector() -> None:
    assert not _disagrees((True, 1e-6, 0))
    assert _disagrees((False, 0.3, 2))


def test_mux_check_outcome_detector() -> None:
    assert not _failed((True, "expected", "observed", None))
    assert _failed((False, "expected", "observed", None))
