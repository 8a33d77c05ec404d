"""Run the bench: load once, measure the machine, run every schedule interleaved ``repeat`` times.

Each repeat runs the schedules in the same order (A B C ... A B C ...), each on a fresh engine over
the same loaded weights and the same workload, so no run inherits another's prefix cache. The
subprocess peers (vllm, llamacpp, ct2) are the exception: each configuration runs all its repeats in
one process, loaded once (nxctl/bench/peers/session.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import EngineConfig, parse_dtype, resolve_device
from engine.errors import InvalidRequestError
from engine.loader import ChatTokenizer, LoadedModel, load_model, load_tokenizer, resolve_model
from engine.model_config import ModelConfig
from engine.models.held_weights import held_kv_dtype, holds_quantized, streamed_weight_bytes
from engine.workload import WorkloadRequest, dataset_workload, make_workload
from nxctl.bench import agreement
from nxctl.bench.datasets import RANDOM, dataset_path, read_dataset
from nxctl.bench.http_client import run_http
from nxctl.bench.machine import (
    compute_dtype,
    matmul_peak_gflops,
    memory_read_gbps,
    model_flops,
    peak_rss_mb,
)
from nxctl.bench.memory_probe import measure
from nxctl.bench.options import LONG_PROMPTS, SEQUENTIAL_SUBSET, BenchOptions
from nxctl.bench.peer_hf import load_hf_model, run_hf
from nxctl.bench.peers.records import decode_tps, schedule_run
from nxctl.bench.peers.registry import DEFAULT_PEERS_DIR, SUBPROCESS_SCHEDULES
from nxctl.bench.peers.session import SINGLE, WORKLOAD, PeerOutcome, PeerRuns
from nxctl.bench.schedules import (
    Advance,
    ScheduleRun,
    decode_throughput,
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
    memory: dict[str, float] = field(default_factory=dict)  # nxctl/bench/memory_probe.py's figures
    read_gbps: float | None = None  # the machine's memory read bandwidth measured in this run
    setup_s: dict[str, float] = field(default_factory=dict)  # wall time of loading, peak, warm-up
    skipped: dict[str, str] = field(default_factory=dict)  # peer or schedule -> the line said about it
    peer_info: dict[str, dict[str, Any]] = field(default_factory=dict)  # schedule -> what its driver said
    quantized_weights: bool = False  # our schedules held quantized weights (so --activations applied)
    kv_cache_dtype: str = ""  # what our schedules' KV pools held (--kv-cache-dtype resolved)


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
    peer_runs: PeerRuns
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)  # first repeat's token ids per run

    def engine_config(self, **overrides: Any) -> EngineConfig:
        """Our schedules' engine: the run's engine settings without speculation (``spec_config``'s alone)."""
        base = self.opts.engine.as_fields() | {
            "speculative": None,
            "draft_model": None,
            "threads": self.opts.threads,
            "max_num_seqs": self.opts.max_num_seqs,
        }
        if {"dtype", "quantize"} & overrides.keys():
            # a run at another dtype (--compare-dtype) or on the float path takes its own cache rule
            base["kv_cache_dtype"] = "auto"
        return EngineConfig(**(base | overrides))

    def spec_config(self) -> EngineConfig:
        """cb_spec's engine: cb_invariant's with the run's speculative decoding."""
        opts = self.opts
        return self.engine_config(
            speculative=opts.engine.speculative,
            num_speculative_tokens=opts.engine.num_speculative_tokens,
            draft_model=opts.engine.draft_model,
        )


def _measured(ctx: _Context, name: str, run: ScheduleRun, dtype: str) -> dict[str, Any]:
    """Our schedules' figures: weights streamed as the engine holds them (quantized, or at ``dtype``'s
    size), FLOP/s against the peak of ``dtype``."""
    step_bytes = streamed_weight_bytes(ctx.loaded.config, dtype, ctx.opts.engine.quantize, name != "cb_fast")
    return _figures(ctx, name, run, step_bytes, ctx.peaks[dtype])


def _figures(
    ctx: _Context, name: str, run: ScheduleRun, step_bytes: int | None, peak: float | None
) -> dict[str, Any]:
    """vLLM metrics plus achieved FLOP/s and its fraction of ``peak``, GB/s of weights (forwards x
    ``step_bytes``) and its fraction of the read bandwidth, engine counters, tenants. A fraction or
    GB/s that does not apply (no peak, forwards unknown) is None."""
    metrics = compute_metrics(run.records, run.duration)
    metrics["decode_tps"] = decode_throughput(run.records)
    gflops = model_flops(ctx.loaded.config, run.work) / run.duration / 1e9
    metrics["achieved_gflops"] = gflops
    metrics["peak_fraction"] = None if peak is None else gflops / peak
    gbps = None
    if step_bytes is not None and run.work.forwards:
        gbps = run.work.forwards * step_bytes / run.duration / 1e9
    metrics["weights_gbps"] = gbps
    metrics["bandwidth_fraction"] = None if gbps is None else gbps / ctx.read_gbps
    metrics.update(run.counters)
    tenants: dict[str, int] = {}
    for r in run.records:
        tenants[r.tenant] = tenants.get(r.tenant, 0) + r.output_tokens
    metrics["tenant_output_tokens"] = dict(sorted(tenants.items()))
    ctx.tokens.setdefault(name, [r.token_ids for r in run.records])
    return metrics


def _requested(requests: list[WorkloadRequest]) -> int:
    return sum(r.output_len for r in requests)


def _compare_config(ctx: _Context) -> EngineConfig:
    """cb_invariant's config at --compare-dtype or with --compare-activations (one of them is set)."""
    opts = ctx.opts
    if opts.compare_activations is not None:
        return ctx.engine_config(activations=opts.compare_activations)
    return ctx.engine_config(dtype=opts.compare_dtype)


def _run_one(ctx: _Context, name: str, label: str, rep: int) -> dict[str, Any]:
    """One schedule's run (the engine is made fresh for it)."""
    opts, reqs = ctx.opts, ctx.requests
    continuous = {
        "cb_invariant": ctx.engine_config(),
        "cb_fast": ctx.engine_config(batch_invariant=False),
        "cb_nocache": ctx.engine_config(enable_prefix_caching=False),
    }
    if opts.engine.speculative is not None:
        continuous["cb_spec"] = ctx.spec_config()
    if opts.compare_schedule:
        continuous[opts.compare_schedule] = _compare_config(ctx)
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
        return _measured(ctx, name, run, opts.engine.dtype) | {"requests_run": len(subset)}
    if name == "hf":
        advance = ctx.start_task(label, _requested(reqs))
        return _measured(ctx, name, run_hf(ctx.hf_model, reqs, opts.max_num_seqs, advance), opts.engine.dtype)
    if name == "single":
        return _single(ctx, label, rep)
    if name in SUBPROCESS_SCHEDULES:
        return _peer(ctx, name, label, rep)
    raise ValueError(f"no runner for schedule {name!r}")


def _peer_outcome(ctx: _Context, name: str, label: str, tokens: int) -> PeerOutcome | None:
    """A subprocess peer's answer; the first call runs its driver (a progress task for the wait)."""
    fresh = name not in ctx.peer_runs.done
    advance = ctx.start_task(f"{label} (subprocess)", tokens) if fresh else None
    outcome = ctx.peer_runs.outcome(name)
    if advance is not None:
        advance(tokens)
    return outcome


def _peer_peak(ctx: _Context, outcome: PeerOutcome) -> float | None:
    """The float32 matmul peak bounds a float32 peer on a CPU; other arithmetic has no measured peak."""
    return ctx.peaks["float32"] if outcome.float_matmul and ctx.device.type == "cpu" else None


def _peer(ctx: _Context, name: str, label: str, rep: int) -> dict[str, Any]:
    """A subprocess peer's repeat ``rep`` of the workload, with the same figures as ours."""
    outcome = _peer_outcome(ctx, name, label, _requested(ctx.requests))
    if outcome is None:
        return {}
    run = schedule_run(outcome.requests[WORKLOAD], outcome.answer.runs[WORKLOAD][rep])
    return _figures(ctx, name, run, outcome.step_bytes, _peer_peak(ctx, outcome))


def _single(ctx: _Context, label: str, rep: int) -> dict[str, Any]:
    """Decode tokens/s of the first request alone: our invariant engine, and the peers that ran it."""
    req = dataclasses.replace(ctx.requests[0], arrival_s=0.0)
    advance = ctx.start_task(label, req.output_len * (2 if ctx.hf_model is not None else 1))
    ours = run_static(make_engine(ctx.loaded, ctx.engine_config()), [req], 1, advance)
    step_bytes = streamed_weight_bytes(ctx.loaded.config, ctx.opts.engine.dtype, ctx.opts.engine.quantize)
    result: dict[str, Any] = {"output_len": req.output_len}
    runs = [("invariant", ours)]
    if ctx.opts.engine.speculative is not None:
        runs.append(("spec", run_static(make_engine(ctx.loaded, ctx.spec_config()), [req], 1, advance)))
    if ctx.hf_model is not None:
        runs.append(("hf", run_hf(ctx.hf_model, [req], 1, advance)))
    for who, run in runs:
        record = run.records[0]
        result |= _decode_figures(ctx, who, decode_tokens_per_s(record), record.ttft, step_bytes)
    result |= _prefill_figures(ctx)
    for name in ctx.peer_runs.schedules():
        outcome = _peer_outcome(ctx, name, name, req.output_len)
        if outcome is not None and SINGLE in outcome.answer.runs:
            answer = outcome.answer.runs[SINGLE][rep].requests[0]
            ttft = answer.token_times[0] if answer.token_times else None
            result |= _decode_figures(ctx, name, decode_tps(answer), ttft, outcome.step_bytes)
            result |= _peer_bench_figures(name, outcome.answer.info)
    return result


PREFILL_TOKENS = 512  # the prompt whose prefill rate the single schedule reports (llama-bench's -p 512)


def _prefill_figures(ctx: _Context) -> dict[str, float | None]:
    """One prompt of PREFILL_TOKENS random tokens (fewer if the context is shorter) alone on our invariant
    engine: its TTFT and prefill tok/s (prompt tokens / TTFT); with --long, each of its prompts too
    (``invariant_prefill_<tokens>_ms`` / ``_tps``)."""
    length = min(PREFILL_TOKENS, ctx.loaded.config.max_position_embeddings - 2)
    ms, tps = _prefill_alone(ctx, length)
    figures = {"prefill_tokens": length, "invariant_prefill_ms": ms, "invariant_prefill_tps": tps}
    for tokens in ctx.opts.long_prompts:
        ms, tps = _prefill_alone(ctx, tokens)
        figures |= {f"invariant_prefill_{tokens}_ms": ms, f"invariant_prefill_{tokens}_tps": tps}
    return figures


def _prefill_alone(ctx: _Context, length: int) -> tuple[float | None, float | None]:
    """(TTFT in ms, prompt tokens / TTFT) of one prompt of ``length`` random tokens alone on a fresh engine."""
    config = ctx.loaded.config
    ids = torch.randint(0, config.vocab_size, (length,), generator=torch.Generator().manual_seed(length))
    req = WorkloadRequest(0, ids.tolist(), 1, 0.0, "prefill")
    record = run_static(make_engine(ctx.loaded, ctx.engine_config()), [req], 1, lambda n: None).records[0]
    tps = None if record.ttft is None or record.ttft <= 0 else length / record.ttft
    return _ms(record.ttft), tps


def check_long_prompts(opts: BenchOptions, config: ModelConfig) -> None:
    """InvalidRequestError, in one line, for a --long prompt the model's context or the KV pool cannot hold."""
    settings = opts.engine
    pool = settings.num_kv_blocks * settings.block_size
    for tokens in opts.long_prompts:
        if tokens + 1 > config.max_position_embeddings:
            raise InvalidRequestError(
                f"--long: a {tokens}-token prompt is beyond {config.name}'s context of {config.max_position_embeddings}"
            )
        if tokens + 1 > pool:
            blocks = -(-(tokens + 1) // settings.block_size)
            raise InvalidRequestError(
                f"--long: a {tokens}-token prompt needs {blocks} KV blocks of {settings.block_size} tokens; "
                f"--num-kv-blocks is {settings.num_kv_blocks}"
            )


def _peer_bench_figures(name: str, info: dict[str, Any]) -> dict[str, float]:
    """A peer's own benchmark of one request (llama.cpp's llama-bench: ``info.llama_bench``), as
    ``<name>_prefill_tps`` (its pp512) and ``<name>_bench_decode_tps`` (its tg128); --long's prompts
    from it or, where a driver times them itself (vLLM's: ``info.prefill_alone``), from that, as
    ``<name>_prefill_<tokens>_tps`` and ``_ms``."""
    figures = (info.get("llama_bench") or {}) | (info.get("prefill_alone") or {})
    out = {}
    if f"pp{PREFILL_TOKENS}" in figures:
        out[f"{name}_prefill_tps"] = float(figures[f"pp{PREFILL_TOKENS}"])
    for tokens in LONG_PROMPTS:
        if f"pp{tokens}" in figures:
            tps = float(figures[f"pp{tokens}"])
            out |= {f"{name}_prefill_{tokens}_tps": tps, f"{name}_prefill_{tokens}_ms": 1000.0 * tokens / tps}
    decode = sorted(k for k in figures if k.startswith("tg"))
    if decode:
        out[f"{name}_bench_decode_tps"] = float(figures[decode[0]])
        out[f"{name}_bench_decode_tokens"] = int(decode[0][2:])
    return out


def _decode_figures(
    ctx: _Context, who: str, tps: float | None, ttft_s: float | None, step_bytes: int | None
) -> dict[str, float | None]:
    """One request's decode tok/s, TTFT and weights streamed (a decode step reads every weight once:
    tok/s x bytes per forward) with its fraction of the read bandwidth, named for ``who``."""
    gbps = None if tps is None or step_bytes is None else tps * step_bytes / 1e9
    return {
        f"{who}_decode_tps": tps,
        f"{who}_decode_bytes_per_token": step_bytes,
        f"{who}_ttft_ms": _ms(ttft_s),
        f"{who}_decode_weights_gbps": gbps,
        f"{who}_decode_bandwidth_fraction": None if gbps is None else gbps / ctx.read_gbps,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _warm_up(ctx: _Context) -> None:
    """A short request through each engine kind and the peer: first-call costs stay out of the timings."""
    req = WorkloadRequest(0, ctx.requests[0].prompt_token_ids[:16], 2, 0.0, "warm-up")
    configs = [ctx.engine_config(), ctx.engine_config(batch_invariant=False)]
    if ctx.opts.engine.speculative is not None:
        configs.append(ctx.spec_config())
    if ctx.opts.compare_schedule:
        configs.append(_compare_config(ctx))
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
    tf = agreement.teacher_forced_agreement(ctx.loaded, opts.engine.dtype, opts.compare_dtype, prompts, base)
    return {"greedy_agreement": agreement.greedy_agreement(ours, base), "teacher_forced_top1_agreement": tf}


QUANTIZED_AGREEMENT_REQUESTS = 16  # requests re-run on the float path for the quantized agreement


def _holds_quantized(ctx: _Context) -> bool:
    """Whether our schedules hold quantized weights: a GGUF's quantized tensors kept (--quantize auto)
    or float weights quantized at load (--quantize int8); never under --quantize none."""
    return holds_quantized(ctx.loaded.config, ctx.opts.engine.quantize)


def _kv_cache_dtype(ctx: _Context) -> str:
    """The dtype our schedules' KV pools hold."""
    opts = ctx.opts
    return held_kv_dtype(
        ctx.loaded.config, opts.engine.dtype, opts.engine.quantize, opts.engine.kv_cache_dtype
    )


def _quantized_agreement(ctx: _Context) -> dict[str, float]:
    """The quantized path against the float32 path over the dequantized weights (``quantize="none"``).
    Empty when nothing is held quantized or not greedy."""
    opts = ctx.opts
    if not opts.agreement or not _holds_quantized(ctx) or opts.workload.sampling != "greedy":
        return {}
    return _agreement_against(ctx, {"quantize": "none"}, "quantized_vs_float")


def _kv_agreement(ctx: _Context) -> dict[str, float]:
    """An int8 KV pool against a float16 one under the same weights and activations. Empty unless the
    pool is int8 and the run greedy."""
    opts = ctx.opts
    if not opts.agreement or _kv_cache_dtype(ctx) != "int8" or opts.workload.sampling != "greedy":
        return {}
    return _agreement_against(ctx, {"kv_cache_dtype": "float16"}, "int8_kv_vs_float16")


def _agreement_against(ctx: _Context, baseline: dict[str, str], name: str) -> dict[str, float]:
    """cb_invariant's first requests' greedy tokens against the same requests re-run on an engine with the
    ``baseline`` settings: ``<name>_greedy_agreement`` and ``<name>_teacher_forced_top1_agreement``, our
    engine's top-1 along the baseline's tokens (engine_top1_agreement). Empty without cb_invariant's run."""
    ours = ctx.tokens.get("cb_invariant")
    if ours is None:
        return {}
    subset = ctx.requests[:QUANTIZED_AGREEMENT_REQUESTS]
    base_run = run_continuous(make_engine(ctx.loaded, ctx.engine_config(**baseline)), subset, lambda n: None)
    base = [r.token_ids for r in base_run.records]  # in request order, as ctx.tokens
    ours = ours[: len(subset)]
    engine = make_engine(ctx.loaded, ctx.engine_config())
    prompts = [r.prompt_token_ids for r in subset]
    return {
        f"{name}_greedy_agreement": agreement.greedy_agreement(ours, base),
        f"{name}_teacher_forced_top1_agreement": agreement.engine_top1_agreement(engine, prompts, base, ours),
    }


def _memory(ctx: _Context, notify: Callable[[str], object]) -> dict[str, float]:
    """memory_probe's figures for the run's model and settings (a fresh process), or empty if it failed."""
    opts = ctx.opts
    try:
        figures = measure(
            opts.model,
            opts.engine.dtype,
            opts.engine.quantize,
            opts.engine.num_kv_blocks,
            opts.engine.kv_cache_dtype,
        )
    except RuntimeError as exc:
        notify(f"bench: {exc}")
        return {}
    return figures.to_json()


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
    loaded = load_model(source)
    if opts.compare_activations is not None and not holds_quantized(loaded.config, opts.engine.quantize):
        raise InvalidRequestError(
            f"--compare-activations: {opts.model} holds no quantized weights under --quantize {opts.engine.quantize}, "
            "so activations change nothing"
        )
    check_long_prompts(opts, loaded.config)
    requests = _workload(opts, loaded.config, loaded.tokenizer)
    notify(f"bench: load {clock.lap('load'):.1f} s")
    device = resolve_device("auto")
    dtypes = {"float32", opts.engine.dtype} | ({opts.compare_dtype} if opts.compare_dtype else set())
    peaks = {d: matmul_peak_gflops(compute_dtype(parse_dtype(d), device), device) for d in sorted(dtypes)}
    read_gbps = memory_read_gbps(device)
    notify(f"bench: matmul_peak, read bandwidth {clock.lap('matmul_peak'):.1f} s")
    wants_peer = "hf" in names or ("single" in names and "hf" in opts.peers)
    hf_model = load_hf_model(source, parse_dtype(opts.engine.dtype), device) if wants_peer else None
    notify(f"bench: load_peer {clock.lap('load_peer'):.1f} s")
    peer_runs = PeerRuns(
        loaded,
        requests,
        opts.peers,
        names,
        opts.peers_dir or DEFAULT_PEERS_DIR,
        torch.get_num_threads(),
        opts.max_num_seqs,
        opts.repeat,
        notify,
        long_prompts=opts.long_prompts,
    )
    names = tuple(n for n in names if n not in SUBPROCESS_SCHEDULES or n in peer_runs.schedules())
    ctx = _Context(opts, loaded, requests, device, peaks, read_gbps, hf_model, start_task, peer_runs)
    _warm_up(ctx)
    notify(f"bench: warm_up {clock.lap('warm_up'):.1f} s")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(opts.repeat):
        for name in names:
            label = name if opts.repeat == 1 else f"{name} ({rep + 1}/{opts.repeat})"
            started = time.perf_counter()
            runs[name].append(_run_one(ctx, name, label, rep))
            notify(f"bench: {label} done in {time.perf_counter() - started:.1f} s")
    runs = {name: r for name, r in runs.items() if all(r)}  # a peer that failed ran nothing
    clock.lap("schedules")
    extras = _dtype_agreement(ctx) if opts.compare_dtype else {}
    extras |= _quantized_agreement(ctx)
    extras |= _kv_agreement(ctx)
    clock.lap("agreement")
    memory = _memory(ctx, notify)
    clock.lap("memory")
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
        skipped=peer_runs.skipped,
        peer_info=peer_runs.info(),
        memory=memory,
        quantized_weights=_holds_quantized(ctx),
        kv_cache_dtype=_kv_cache_dtype(ctx),
    )


def _workload(opts: BenchOptions, config: ModelConfig, tokenizer: ChatTokenizer) -> list[WorkloadRequest]:
    """The run's requests: random tokens, or a fixed dataset's prompts (--workload)."""
    if opts.dataset is None or opts.dataset == RANDOM:
        return make_workload(opts.workload, config.vocab_size, config.max_position_embeddings)
    rows = read_dataset(dataset_path(opts.dataset), tokenizer)
    return dataset_workload(rows, opts.workload)


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
    """The workload over HTTP; the model config (vocab, context) and tokenizer (a --workload dataset's
    prompts) come from --model, read cheaply (no weights)."""
    config, tokenizer = load_tokenizer(resolve_model(opts.model))
    requests = _workload(opts, config, tokenizer)
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
