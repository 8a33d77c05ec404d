"""`nxctl mux plan --replicas N`: the registry's models placed across replicas (engine/mux/placement.py),
and with ``--trace`` the hit rate a replay of it predicts for that placement."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError
from engine.mux.placement import ReplicaReplay, place_models, placement_json, predict_hits
from engine.mux.registry import load_registry
from engine.mux.trace import load_trace


def replica_budgets(budget_mb: str, replicas: int, parse: Any) -> list[int]:
    """One budget (bytes) per replica from ``--budget-mb``: one value for every replica, or one per replica
    comma-separated; ``parse`` reads one value (mux.parse_budget_mb)."""
    if replicas < 1:
        raise InvalidRequestError(f"--replicas must be at least 1, got {replicas}")
    values = [parse(v.strip()) for v in budget_mb.split(",")]
    if len(values) == 1:
        return values * replicas
    if len(values) != replicas:
        raise InvalidRequestError(f"--budget-mb gives {len(values)} budgets for {replicas} replicas")
    return values


def plan_replicas(
    budgets: list[int], registry_path: Path | None, trace_path: Path | None, load_gbps: float
) -> dict[str, Any]:
    """The placement of the registry's models over ``budgets``, with the replay's prediction where a trace
    is given (homes then favour the models it asks for most): what `--json` prints."""
    if not math.isfinite(load_gbps) or load_gbps <= 0:
        raise InvalidRequestError(f"--load-gbps must be a positive number, got {load_gbps}")
    registry = load_registry(registry_path)
    names = {m.id: m.name for m in registry.models}
    trace = load_trace(trace_path, registry) if trace_path is not None else None
    weights = Counter(r.model for r in trace) if trace is not None else None
    placement = place_models(registry.sizes(), budgets, weights)
    payload: dict[str, Any] = {"registry": registry.origin, **placement_json(placement, names)}
    if trace is not None:
        rate, replays, refused = predict_hits(registry, trace, placement, load_gbps)
        payload["trace"] = {
            "path": str(trace_path),
            "requests": len(trace),
            "load_gbps": load_gbps,
            "hit_rate": rate,
            "refused": refused,
            "replicas": [_replay_json(r) for r in replays],
        }
    return payload


def _replay_json(replica: ReplicaReplay) -> dict[str, Any]:
    result = replica.result
    if result is None:
        return {"replica": replica.replica, "requests": 0}
    return {
        "replica": replica.replica,
        "requests": result.requests,
        "hits": result.hits,
        "loads": result.loads,
        "evicts": result.evicts,
        "stall_s": result.stall_s,
    }


def format_replica_plan(payload: dict[str, Any]) -> str:
    """The table `nxctl mux plan --replicas N` prints."""
    count = len(payload["replicas"])
    verdict = "every model resident somewhere" if payload["complete"] else "not every model fits"
    lines = [
        f"mux plan: {count} replica{'s' if count > 1 else ''}, {verdict}"
        + ("" if payload["exhaustive"] else " (search cut short)")
    ]
    for entry in payload["replicas"]:
        models = ", ".join(
            f"{n} ({size:.0f} MB)" for n, size in zip(entry["models"], entry["models_mb"], strict=True)
        )
        lines.append(
            f"  replica {entry['replica']}: budget {entry['budget_mb']:.0f} MB, homes {entry['homed_mb']:.0f} MB: "
            f"{models or 'none'}"
        )
    for entry in payload["unplaced"]:
        lines.append(f"  no home: {entry['model']}: {entry['reason']}")
    trace = payload.get("trace")
    if trace:
        lines.append(
            f"replay of {trace['path']} ({trace['requests']} requests, loads at {trace['load_gbps']:g} GB/s, "
            f"LRU per replica): predicted hit rate {trace['hit_rate']:.3f}, refused {trace['refused']}"
        )
        for r in trace["replicas"]:
            if r["requests"]:
                lines.append(
                    f"  replica {r['replica']}: {r['requests']} requests, hits {r['hits']}, loads {r['loads']}, "
                    f"evicts {r['evicts']}, stalled {r['stall_s']:.1f} s"
                )
    return "\n".join(lines)
