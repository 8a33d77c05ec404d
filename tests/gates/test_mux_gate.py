"""The mux gate: GREEN on the demo registry, RED when a negative control is blinded or a liar slips in."""

from __future__ import annotations

from pathlib import Path

from engine.mux.policies import LRU
from engine.mux.registry import load_registry
from gates.framework import read_tsv, run_gate
from gates.mux_gate import GATE, ForceLoad, MostRecentlyUsed, check_budget, check_lru, check_refusal

NEGATIVES = ("mux.neg.mru", "mux.neg.force_load_refusal", "mux.neg.force_load_budget")


def test_gate_is_green_and_writes_its_tsv(tmp_path: Path) -> None:
    result = run_gate(GATE, tmp_path)
    assert result.green, [r for r in result.rows if not r.ok]
    rows = read_tsv(tmp_path / "mux.tsv")
    assert [r["check"] for r in rows] == list(GATE.checks)
    assert {r["check"]: r["kind"] for r in rows if r["kind"] == "neg"} == dict.fromkeys(NEGATIVES, "neg")
    assert all(r["verdict"] == "GREEN" for r in rows)


def test_blinding_the_negative_controls_turns_exactly_them_red() -> None:
    """Blinded together (blinding touches only its own row): each control, and nothing else, goes RED."""
    assert GATE.negatives == NEGATIVES
    result = run_gate(GATE, blind=NEGATIVES)
    assert not result.green
    assert {r.check for r in result.rows if not r.ok} == set(NEGATIVES)


def test_the_liars_really_fail_the_checks() -> None:
    registry = load_registry()
    assert check_lru(registry, LRU)[0] and not check_lru(registry, MostRecentlyUsed)[0]
    ok, _, _, forced = check_refusal(registry, ForceLoad)
    assert not ok and forced.loads == 1 and forced.refused == 0
    assert check_budget([forced])[0] is False
    assert check_budget([check_refusal(registry, LRU)[3]])[0] is True


def test_check_ids_are_the_stable_ones() -> None:
    assert GATE.name == "mux"
    assert GATE.checks == (
        "mux.registry_sizes",
        "mux.hit",
        "mux.evict_cycle",
        "mux.refuse_oversized",
        "mux.lru",
        "mux.budget",
        *NEGATIVES,
    )
