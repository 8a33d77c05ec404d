"""Many models under one memory budget: the registry, footprints, eviction policies and residency manager
(pure logic), the simulator and trace replay built on them, and the live ModelPool.

Importing this package does not import torch: only computing a real model's footprint or loading it does.

    model_spec.py one registry entry (ModelSpec), torch-free
    registry.py   the TOML registry of models (declared sizes or real sources) and their replay rates
    footprint.py  weights + KV pool + stated activation allowance, from a model's files
    plans.py      what a policy sees (ResidencyView) and decides (Hit / Load / Wait / Refuse)
    policies.py   lru, lfu, gdsf, oracle behind one Policy interface
    residency.py  the ResidencyManager: budget bookkeeping, busy protection, counters
    simulator.py  a request sequence, one at a time (`nxctl mux run`)
    trace.py      timed JSONL traces
    replay.py     event-driven replay of a trace with loads, service times and busy models
    planner.py    which real models fit together, and the largest context (`nxctl mux plan`)
    memory.py     RSS / CUDA measurements and giving freed memory back
    pool.py       ModelPool: real models loaded and unloaded under the budget
"""

from __future__ import annotations

from engine.mux.plans import Hit, Load, Plan, Refuse, ResidencyView, Wait
from engine.mux.policies import POLICIES, Policy, make_policy
from engine.mux.registry import MB, ModelSpec, Registry, RegistryError, load_registry
from engine.mux.residency import Counters, ResidencyError, ResidencyManager
from engine.mux.simulator import SimResult, simulate, simulate_registry

__all__ = [
    "MB",
    "POLICIES",
    "Counters",
    "Hit",
    "Load",
    "ModelSpec",
    "Plan",
    "Policy",
    "Refuse",
    "Registry",
    "RegistryError",
    "ResidencyError",
    "ResidencyManager",
    "ResidencyView",
    "SimResult",
    "Wait",
    "load_registry",
    "make_policy",
    "simulate",
    "simulate_registry",
]
