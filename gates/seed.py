"""The gates' drawn-case seed and thread count, read from the environment (torch-free: `nxctl gate` and the
CPU matrix read them before any engine is loaded)."""

from __future__ import annotations

import os

SEED_ENV = "NXCTL_GATE_SEED"
THREADS_ENV = "NXCTL_THREADS"


def gate_seed() -> int:
    """The seed every drawn case derives from (NXCTL_GATE_SEED, default 0)."""
    raw = os.environ.get(SEED_ENV, "0").strip() or "0"
    return int(raw, 0)
