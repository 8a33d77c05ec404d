"""`nxctl mux`: many models under one memory budget. Glue over engine.mux; each command has ``--json``.

nxctl mux run <budget_mb> <id...>         simulate a request sequence (ids or names) under a budget
nxctl mux replay TRACE --budget-mb N      replay a timed trace, policies side by side
nxctl mux plan --budget-mb N MODEL...     footprints of real model files, sets that fit, largest context
nxctl mux plan --replicas R --budget-mb N the registry's models placed across R replicas (--trace: hit rate)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from engine.errors import InvalidRequestError, NxError
from engine.mux.footprint import footprint_of
from engine.mux.planner import CapacityPlan, plan_capacity
from engine.mux.policies import POLICIES, parse_policies
from engine.mux.registry import DEFAULT_ACTIVATION_MB, MB, Registry, load_registry, mb
from engine.mux.replay import DEFAULT_LOAD_GBPS, ReplayResult, replay_policies
from engine.mux.simulator import SimResult, simulate_registry
from engine.mux.trace import load_trace
from nxctl.commands.common import fail
from nxctl.commands.mux_replicas import format_replica_plan, plan_replicas, replica_budgets

app = typer.Typer(help="Many models under one memory budget: simulate, replay traces, plan capacity.")

RegistryOpt = Annotated[
    Path | None, typer.Option("--registry", help="Registry TOML (default: fixtures/mux-demo.toml).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def parse_budget_mb(text: str) -> int:
    """'16000' -> bytes; InvalidRequestError for anything but a positive, finite number of MB."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidRequestError(f"budget must be a number of MB, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequestError(f"budget must be a positive number of MB, got {text}")
    return int(value * MB)


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (shorter, machine-independent)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def run_sequence(
    budget_mb: str, models: list[str], registry_path: Path | None = None, policy: str = "lru"
) -> tuple[SimResult, Registry]:
    """The simulation `nxctl mux run` prints."""
    budget = parse_budget_mb(budget_mb)
    names = parse_policies(policy)
    if len(names) != 1:
        raise InvalidRequestError(f"mux run takes one policy, got {policy!r}")
    registry = load_registry(registry_path)
    return simulate_registry(registry, budget, models, names[0]), registry


def format_run(result: SimResult, registry: Registry) -> str:
    def label(model: int) -> str:
        return registry.get(model).name

    lines = [
        f"mux run: budget {mb(result.budget_bytes):.0f} MB, policy {result.policy}, "
        f"registry {display_path(registry.origin)}",
        f"{'#':>3}  {'model':<14}{'action':<8}{'evicted':<22}resident (MB)",
    ]
    for step in result.steps:
        evicted = ", ".join(label(m) for m in step.evicted) or "-"
        resident = ", ".join(label(m) for m in step.resident) or "-"
        what = f"{step.model} {label(step.model)}"
        held = f"{resident} ({mb(step.resident_bytes):.0f})"
        lines.append(f"{step.tick:>3}  {what:<14}{step.action:<8}{evicted:<22}{held}")
        if step.reason:
            lines.append(f"{'':>5}refused: {step.reason}")
    lines.append(
        f"hits {result.hits}  loads {result.loads}  evicts {result.evicts}  refused {result.refused}  "
        f"peak {mb(result.peak_bytes):.0f} MB (budget {mb(result.budget_bytes):.0f} MB)"
    )
    return "\n".join(lines)


def replay_trace(
    trace_path: Path, budget_mb: str, policies: str, load_gbps: float, registry_path: Path | None = None
) -> tuple[list[ReplayResult], dict[str, Any]]:
    """The replays `nxctl mux replay` prints, and a description of the trace."""
    budget = parse_budget_mb(budget_mb)
    names = parse_policies(policies)
    if not math.isfinite(load_gbps) or load_gbps <= 0:
        raise InvalidRequestError(f"--load-gbps must be a positive number, got {load_gbps}")
    registry = load_registry(registry_path)
    trace = load_trace(trace_path, registry)
    about = {
        "trace": str(trace_path),
        "requests": len(trace),
        "span_s": trace[-1].t - trace[0].t,
        "budget_mb": mb(budget),
        "load_gbps": load_gbps,
        "registry": display_path(registry.origin),
    }
    return replay_policies(registry, trace, budget, names, load_gbps), about


def format_replay(results: list[ReplayResult], about: dict[str, Any]) -> str:
    rows: list[tuple[str, Any]] = [
        ("hit rate", lambda r: f"{r.hit_rate:.3f}"),
        ("hits", lambda r: r.hits),
        ("loads", lambda r: r.loads),
        ("evictions", lambda r: r.evicts),
        ("refusals", lambda r: r.refused),
        ("loads waiting on busy", lambda r: r.busy_waits),
        ("stalled on loads (s)", lambda r: f"{r.stall_s:.1f}"),
        ("peak (MB)", lambda r: f"{mb(r.peak_bytes):.0f}"),
        ("makespan (s)", lambda r: f"{r.makespan_s:.1f}"),
    ]
    lines = [
        f"mux replay {about['trace']}: {about['requests']} requests over {about['span_s']:.0f} s, "
        f"budget {about['budget_mb']:.0f} MB, loads at {about['load_gbps']:g} GB/s",
        f"{'metric':<22}" + "".join(f"{r.policy:>10}" for r in results),
    ]
    for title, cell in rows:
        lines.append(f"{title:<22}" + "".join(f"{cell(r)!s:>10}" for r in results))
    return "\n".join(lines)


def plan_models(
    models: list[str], budget_mb: str, dtype: str, num_kv_blocks: int, block_size: int, activation_mb: float
) -> CapacityPlan:
    """The capacity plan `nxctl mux plan` prints."""
    budget = parse_budget_mb(budget_mb)
    if not math.isfinite(activation_mb) or activation_mb < 0:
        raise InvalidRequestError(f"--activation-mb must be >= 0, got {activation_mb}")
    act = int(activation_mb * MB)
    footprints = [footprint_of(m, dtype, num_kv_blocks, block_size, act) for m in models]
    return plan_capacity(footprints, budget)


def format_plan(plan: CapacityPlan) -> str:
    first = plan.footprints[0]
    lines = [
        f"mux plan: budget {mb(plan.budget_bytes):.0f} MB, {first.dtype}, "
        f"KV pool {first.num_kv_blocks} blocks x {first.block_size} tokens, "
        f"activations {mb(first.activation_bytes):g} MB (stated allowance)",
        f"{'model':<18}{'params':>12}{'weights MB':>12}{'KV/block KB':>13}{'KV pool MB':>12}"
        f"{'total MB':>10}{'alone':>7}{'max context':>13}",
    ]
    for i, f in enumerate(plan.footprints):
        lines.append(
            f"{f.name:<18}{f.num_params:>12,}{mb(f.weight_bytes):>12.1f}{f.kv_bytes_per_block / 1024:>13.1f}"
            f"{mb(f.kv_bytes):>12.1f}{mb(f.total_bytes):>10.1f}{'fits' if plan.fits_alone(i) else 'no':>7}"
            f"{plan.max_context(i):>13,}"
        )
    lines.append("sets that fit together (maximal, largest first):")
    for members in plan.fitting_sets:
        names = " + ".join(plan.footprints[i].name for i in members)
        lines.append(f"  {names}  ({mb(plan.set_bytes(members)):.1f} MB)")
    if not plan.fitting_sets:
        lines.append("  none: no model fits the budget on its own")
    return "\n".join(lines)


def _emit(payload: dict[str, Any] | list[Any], text: str, as_json: bool) -> None:
    typer.echo(json.dumps(payload, indent=2) if as_json else text)


@app.command("run", context_settings={"ignore_unknown_options": True})
def run(
    budget_mb: Annotated[str, typer.Argument(help="Memory budget in MB (MiB).", show_default=False)],
    models: Annotated[list[str], typer.Argument(help="The requests, in order: model ids or names.")],
    registry: RegistryOpt = None,
    policy: Annotated[str, typer.Option("--policy", help=f"One of {', '.join(POLICIES)}.")] = "lru",
    as_json: JsonOpt = False,
) -> None:
    """Simulate a request sequence under a memory budget: hits, loads, evicts, refused, peak memory."""
    try:
        result, reg = run_sequence(budget_mb, models, registry, policy)
    except NxError as exc:
        fail(str(exc))
    names = {m.id: m.name for m in reg.models}
    _emit(result.to_json(names), format_run(result, reg), as_json)


@app.command("replay")
def replay(
    trace: Annotated[
        Path, typer.Argument(help="Trace JSONL: t, model, prompt_tokens, output_tokens per line.")
    ],
    budget_mb: Annotated[str, typer.Option("--budget-mb", help="Memory budget in MB (MiB).")],
    policy: Annotated[str, typer.Option("--policy", help="Comma-separated policies.")] = ",".join(POLICIES),
    load_gbps: Annotated[
        float, typer.Option("--load-gbps", help="Load bandwidth, GB/s.")
    ] = DEFAULT_LOAD_GBPS,
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a timed trace under a budget, a column per policy: hit rate, loads, evictions, stalls, peak."""
    try:
        results, about = replay_trace(trace, budget_mb, policy, load_gbps, registry)
    except NxError as exc:
        fail(str(exc))
    _emit({**about, "results": [r.to_json() for r in results]}, format_replay(results, about), as_json)


@app.command("plan")
def plan(
    models: Annotated[
        list[str] | None,
        typer.Argument(help="Named models, model folders or .gguf files (with --replicas: the registry's)."),
    ] = None,
    budget_mb: Annotated[
        str,
        typer.Option(
            "--budget-mb", help="Memory budget in MB (MiB); with --replicas one, or one per replica: A,B,..."
        ),
    ] = "",
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")] = "float32",
    num_kv_blocks: Annotated[int, typer.Option("--num-kv-blocks", help="KV pool blocks per model.")] = 1024,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per KV block.")] = 16,
    activation_mb: Annotated[
        float, typer.Option("--activation-mb", help="Stated activation allowance per model, MB.")
    ] = DEFAULT_ACTIVATION_MB,
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", help="Place the registry's models across N replicas (a Ray seat's)."),
    ] = None,
    registry: RegistryOpt = None,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="With --replicas: replay this trace, predict the hit rate.")
    ] = None,
    load_gbps: Annotated[
        float, typer.Option("--load-gbps", help="With --trace: load bandwidth, GB/s.")
    ] = DEFAULT_LOAD_GBPS,
    as_json: JsonOpt = False,
) -> None:
    """Footprints of real models (weights + KV pool + activations), which sets fit, the largest context;
    with --replicas, which of the registry's models go where so every one is resident somewhere."""
    try:
        if not budget_mb:
            raise InvalidRequestError("--budget-mb is required")
        if replicas is not None:
            if models:
                raise InvalidRequestError("with --replicas the models are the registry's (--registry)")
            budgets = replica_budgets(budget_mb, replicas, parse_budget_mb)
            payload = plan_replicas(budgets, registry, trace, load_gbps)
            payload["registry"] = display_path(payload["registry"])
            _emit(payload, format_replica_plan(payload), as_json)
            return
        if trace is not None or registry is not None:
            raise InvalidRequestError("--trace and --registry go with --replicas")
        if not models:
            raise InvalidRequestError("name the models to plan for (or --replicas N for the registry's)")
        result = plan_models(models, budget_mb, dtype, num_kv_blocks, block_size, activation_mb)
    except NxError as exc:
        fail(str(exc))
    _emit(result.to_json(), format_plan(result), as_json)
