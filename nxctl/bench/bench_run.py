"""Run the bench: load once, measure the machine, run every schedule interleaved ``repeat`` times.

Each repeat runs the schedules in the same order (A B C ... A B C ...), each on a fresh engine over
the same loaded weights and the same workload, so no run inherits another's prefix cache.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import EngineConfig, ModelConfig, parse_dtype, resolve_device
from engine.loader import LoadedModel, load_config, load_model, resolve_model
from engine.workload import WorkloadRequest, make_workload
from nxctl.bench import agreement
from nxctl.bench.http_client import run_http
from nxctl.bench.machine import (
    compute_dtype,
    forward_weight_bytes,
    matmul_peak_gflops,
    memory_read_gbps,
    model_flops,
    peak_rss_mb,
)
from nxctl.bench.options import SEQUENTIAL_SUBSET, BenchOptions
from nxctl.bench.peer_hf import load_hf_model, run_hf
from nxctl.bench.schedules import (
    Advance,
    ScheduleRun,
    decode_tokens_per_s,
    make_engine,
    run_continuous,
    run_static,
)
from nxctl.bench.serving_metrics import compute_metrics

StartTask = Callable[[str, int], Advance]  # (description, total requested tokens) -> advance


def no_progress(description: str, total: int) -> Advance:
    """A StartTask that shows nothing."""
    return lambda n: None


@dataclass
class BenchResult:
    """Per schedule, one metrics dict per repeat; plus what the machine could do and what it held."""

    options: BenchOptions
    device: str | None
    runs: dict[str, list[dict[str, Any]]]
    peak_gflops: dict[str, float]
    threads: int
    peak_rss_mb: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)
    read_gbps: float | None = None  # the machine's memory read bandwidth measured in this run
    setup_s: dict[str, float] = field(default_factory=dict)  # wall time of loading, peak, warm-up


@dataclass
class _Context:
    opts: BenchOptions
    loaded: LoadedModel
    requests: list[WorkloadRequest]
    device: torch.device
    peaks: dict[str, float]
    read_gbps: float
    hf_model: Any
    start_task: StartTask
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)  # first repeat's token ids per run

    def engine_config(self, **overrides: Any) -> EngineConfig:
        base = {
            "dtype": self.opts.dtype,
            "threads": self.opts.threads,
            "max_num_seqs": self.opts.max_num_seqs,
        }
        return EngineConfig(**(base | overrides))


def _measured(ctx: _Context, name: str, run: ScheduleRun, dtype: str) -> dict[str, Any]:
    """vLLM metrics plus achieved FLOP/s, its fraction of the measured peak, engine counters, tenants."""
    metrics = compute_metrics(run.records, run.duration)
    gflops = model_flops(ctx.loaded.config, run.work) / run.duration / 1e9
    metrics["achieved_gflops"] = gflops
    metrics["peak_fraction"] = gflops / ctx.peaks[dtype]
    streamed = run.work.forwards * forward_weight_bytes(ctx.loaded.config, parse_dtype(dtype))
    gbps = streamed / run.duration / 1e9
    metrics["weights_gbps"] = gbps
    metrics["bandwidth_fraction"] = gbps / ctx.read_gbps
    metrics.update(run.counters)
    tenants: dict[str, int] = {}
    for r in run.records:
        tenants[r.tenant] = tenants.get(r.tenant, 0) + r.output_tokens
    metrics["tenant_output_tokens"] = dict(sorted(tenants.items()))
    ctx.tokens.setdefault(name, [r.token_ids for r in run.records])
    return metrics


def _requested(requests: list[WorkloadRequest]) -> int:
    return sum(r.output_len for r in requests)


def _run_one(ctx: _Context, name: str, label: str) -> dict[str, Any]:
    """One schedule's run (the engine is made fresh for it)."""
    opts, reqs = ctx.opts, ctx.requests
    continuous = {
        "cb_invariant": ctx.engine_config(),
        "cb_fast": ctx.engine_config(batch_invariant=False),
        "cb_nocache": ctx.engine_config(enable_prefix_caching=False),
    }
    if opts.compare_schedule:
        continuous[opts.compare_schedule] = ctx.engine_config(dtype=opts.compare_dtype)
    if name in continuous:
        config = continuous[name]
        advance = ctx.start_task(label, _requested(reqs))
        return _measured(
            ctx, name, run_continuous(make_engine(ctx.loaded, config), reqs, advance), config.dtype
        )
    if name in ("static", "sequential"):
        subset = reqs if name == "static" else reqs[:SEQUENTIAL_SUBSET]
        size = opts.max_num_seqs if name == "static" else 1
        advance = ctx.start_task(label, _requested(subset))
        run = run_static(make_engine(ctx.loaded, ctx.engine_config()), subset, size, advance)
        return _measured(ctx, name, run, opts.dtype) | {"requests_run": len(subset)}
    if name == "hf":
        advance = ctx.start_task(label, _requested(reqs))
        return _measured(ctx, name, run_hf(ctx.hf_model, reqs, opts.max_num_seqs, advance), opts.dtype)
    if name == "single":
        return _single(ctx, label)
    raise ValueError(f"no runner for schedule {name!r}")


def _single(ctx: _Context, label: str) -> dict[str, Any]:
    """Decode tokens/s of the first request alone: our invariant engine, and the peer when there is one."""
    req = dataclasses.replace(ctx.requests[0], arrival_s=0.0)
    advance = ctx.start_task(label, req.output_len * (2 if ctx.hf_model is not None else 1))
    ours = run_static(make_engine(ctx.loaded, ctx.engine_config()), [req], 1, advance)
    step_bytes = forward_weight_bytes(ctx.loaded.config, parse_dtype(ctx.opts.dtype))
    result: dict[str, Any] = {"output_len": req.output_len}
    runs = [("invariant", ours)]
    if ctx.hf_model is not None:
        runs.append(("hf", run_hf(ctx.hf_model, [req], 1, advance)))
    for who, run in runs:
        tps = decode_tokens_per_s(run.records[0])
        result[f"{who}_decode_tps"] = tps
        result[f"{who}_ttft_ms"] = _ms(run.records[0].ttft)
        # a decode step streams every weight once: tok/s x bytes per forward
        gbps = None if tps is None else tps * step_bytes / 1e9
        result[f"{who}_decode_weights_gbps"] = gbps
        result[f"{who}_decode_bandwidth_fraction"] = None if gbps is None else gbps / ctx.read_gbps
    return result


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _warm_up(ctx: _Context) -> None:
    """A short request through each engine kind and the peer: first-call costs stay out of the timings."""
    req = WorkloadRequest(0, ctx.requests[0].prompt_token_ids[:16], 2, 0.0, "warm-up")
    configs = [ctx.engine_config(), ctx.engine_config(batch_invariant=False)]
    if ctx.opts.compare_dtype:
        configs.append(ctx.engine_config(dtype=ctx.opts.compare_dtype))
    for config in configs:
        run_continuous(make_engine(ctx.loaded, config), [req], lambda n: None)
    if ctx.hf_model is not None:
        run_hf(ctx.hf_model, [req, dataclasses.replace(req, index=1)], 2, lambda n: None)


def _dtype_agreement(ctx: _Context) -> dict[str, float]:
    """bf16-vs-f32 style agreement of the run dtype with --compare-dtype (first repeat's tokens)."""
    opts = ctx.opts
    ours, base = ctx.tokens.get("cb_invariant"), ctx.tokens.get(opts.compare_schedule or "")
    if ours is None or base is None or opts.compare_dtype is None:
        return {}
    prompts = [r.prompt_token_ids for r in ctx.requests]
    tf = agreement.teacher_forced_agreement(ctx.loaded, opts.dtype, opts.compare_dtype, prompts, base)
    return {"greedy_agreement": agreement.greedy_agreement(ours, base), "teacher_forced_top1_agreement": tf}


def run_bench(
    opts: BenchOptions,
    start_task: StartTask = no_progress,
    notify: Callable[[str], object] = lambda line: None,
) -> BenchResult:
    """Run every selected schedule ``opts.repeat`` times, interleaved; see the module docstring.

    ``notify`` gets one line per finished phase and schedule run (its wall time), for logs.
    """
    if opts.threads:
        torch.set_num_threads(opts.threads)
    names = opts.selected()
    if opts.url is not None:
        return _run_remote(opts, start_task)
    clock = _Clock()
    source = resolve_model(opts.model)
    config = load_config(source)
    requests = make_workload(opts.workload, config.vocab_size, config.max_position_embeddings)
    loaded = load_model(source)
    notify(f"bench: load {clock.lap('load'):.1f} s")
    device = resolve_device("auto")
    dtypes = {"float32", opts.dtype} | ({opts.compare_dtype} if opts.compare_dtype else set())
    peaks = {d: matmul_peak_gflops(compute_dtype(parse_dtype(d), device), device) for d in sorted(dtypes)}
    read_gbps = memory_read_gbps(device)
    notify(f"bench: matmul_peak, read bandwidth {clock.lap('matmul_peak'):.1f} s")
    wants_peer = "hf" in names or ("single" in names and opts.peer == "hf")
    hf_model = load_hf_model(source, parse_dtype(opts.dtype), device) if wants_peer else None
    notify(f"bench: load_peer {clock.lap('load_peer'):.1f} s")
    ctx = _Context(opts, loaded, requests, device, peaks, read_gbps, hf_model, start_task)
    _warm_up(ctx)
    notify(f"bench: warm_up {clock.lap('warm_up'):.1f} s")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(opts.repeat):
        for name in names:
            label = name if opts.repeat == 1 else f"{name} ({rep + 1}/{opts.repeat})"
            started = time.perf_counter()
            runs[name].append(_run_one(ctx, name, label))
            notify(f"bench: {label} done in {time.perf_counter() - started:.1f} s")
    clock.lap("schedules")
    extras = _dtype_agreement(ctx) if opts.compare_dtype else {}
    clock.lap("agreement")
    return BenchResult(
        opts,
        device.type,
        runs,
        peaks,
        torch.get_num_threads(),
        peak_rss_mb(),
        extras,
        setup_s=clock.laps,
        read_gbps=read_gbps,
    )


class _Clock:
    """Wall time of each setup phase."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now
        return self.laps[name]


def _run_remote(opts: BenchOptions, start_task: StartTask) -> BenchResult:
    """The workload over HTTP; the model config (vocab, context) comes from --model, read cheaply."""
    config: ModelConfig = load_config(resolve_model(opts.model))
    requests = make_workload(opts.workload, config.vocab_size, config.max_position_embeddings)
    concurrency = opts.concurrency or len(requests)
    runs: dict[str, list[dict[str, Any]]] = {"url": []}
    for rep in range(opts.repeat):
        advance = start_task(
            "url" if opts.repeat == 1 else f"url ({rep + 1}/{opts.repeat})", _requested(requests)
        )
        run = run_http(opts.url or "", opts.model, requests, concurrency, advance)
        metrics = compute_metrics(run.records, run.duration)
        metrics["concurrency"] = concurrency
        runs["url"].append(metrics)
    return BenchResult(opts, None, runs, {}, torch.get_num_threads(), peak_rss_mb())
