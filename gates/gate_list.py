"""The registry of gates, in dependency order: `nxctl gate` with no names runs them all in this order.

The census reads the other gates' status files, so it always runs last.
"""

from __future__ import annotations

import importlib

from gates.framework import Gate

# module names under gates/, in the order `nxctl gate` runs them; each module defines ``GATE``.
GATE_MODULES: tuple[str, ...] = (
    "engine_gate",
    "sched_gate",
    "invariance_gate",
    "share_gate",
    "structured_gate",
    "spec_gate",
    "mux_gate",
    "serve_gate",
    "cluster_gate",
    "census_gate",
)


class UnknownGateError(KeyError):
    """A gate name that is not registered."""


def all_gates() -> list[Gate]:
    """Every registered gate, in run order."""
    return [importlib.import_module(f"gates.{name}").GATE for name in GATE_MODULES]


def gate_names() -> list[str]:
    return [g.name for g in all_gates()]


def select(names: list[str]) -> list[Gate]:
    """The named gates, in registry order; raises UnknownGateError naming the known ones."""
    gates = all_gates()
    known = {g.name: g for g in gates}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownGateError(f"unknown gate {', '.join(unknown)}; known gates: {', '.join(known)}")
    wanted = set(names) if names else set(known)
    return [g for g in gates if g.name in wanted]
