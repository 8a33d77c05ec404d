"""The bench's human output: a one-line title, the metrics table by schedule, and the lines under it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rich.table import Table

from nxctl.bench.bench_run import BenchResult
from nxctl.bench.options import SEQUENTIAL_SUBSET
from nxctl.bench.peers.registry import SUBPROCESS_SCHEDULES
from nxctl.bench.serving_metrics import LATENCIES, STATS
from nxctl.bench.summary import cpu_kernels, schedules_json, to_json


def _cell(value: Any, digits: int) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, dict):
        mid = f"{value['median']:.{digits}f}"
        if value["min"] == value["max"]:
            return mid
        return f"{mid} [{value['min']:.{digits}f}-{value['max']:.{digits}f}]"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


ROWS: list[tuple[str, Callable[[dict], Any], int]] = [
    ("requests completed", lambda m: m.get("completed"), 0),
    ("duration (s)", lambda m: m.get("duration"), 1),
    ("request throughput (req/s)", lambda m: m.get("request_throughput"), 3),
    ("output throughput (tok/s)", lambda m: m.get("output_throughput"), 1),
    ("total token throughput (tok/s)", lambda m: m.get("total_token_throughput"), 1),
    *[
        (
            f"{lat.removesuffix('_ms').upper()} {stat} (ms)",
            lambda m, lat=lat, stat=stat: (m.get(lat) or {}).get(stat),
            1,
        )
        for lat in LATENCIES
        for stat in STATS
    ],
    ("achieved GFLOP/s", lambda m: m.get("achieved_gflops"), 2),
    ("% of matmul peak", lambda m: _percent(m.get("peak_fraction")), 2),
    ("weights read (GB/s)", lambda m: m.get("weights_gbps"), 2),
    ("% of read bandwidth", lambda m: _percent(m.get("bandwidth_fraction")), 1),
    ("decode tok/s (after each first token)", lambda m: m.get("decode_tps"), 1),
    ("preemptions", lambda m: m.get("preemptions"), 0),
    ("spec: drafts / draft tokens", lambda m: _pair(m.get("spec_drafts"), m.get("spec_draft_tokens")), 0),
    ("spec: accepted tokens", lambda m: m.get("spec_accepted_tokens"), 0),
    ("spec: acceptance rate", lambda m: m.get("spec_acceptance_rate"), 3),
    ("spec: mean acceptance length", lambda m: m.get("spec_mean_acceptance_length"), 2),
    (
        "prefix cache hits / queries",
        lambda m: _pair(m.get("prefix_cache_hits"), m.get("prefix_cache_queries")),
        0,
    ),
]


def _percent(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v * 100 for k, v in value.items()}
    return None if value is None else value * 100


def _pair(a: Any, b: Any) -> str | None:
    if a is None or b is None:
        return None
    return f"{_cell(a, 0)} / {_cell(b, 0)}"


def title(result: BenchResult) -> str:
    """One line: what was run, on what."""
    opts = result.options
    spec = opts.workload
    rate = "all at t=0" if math.isinf(spec.rate) else f"Poisson {spec.rate:g} req/s"
    extra = f", shared prefix {spec.shared_prefix}" if spec.shared_prefix else ""
    extra += f", {spec.tenants} tenants" if spec.tenants > 1 else ""
    workload = (
        f"{spec.num_requests} requests, input {spec.input_len}, output {spec.output_len}, {rate}{extra}"
        if opts.dataset in (None, "random")
        else f"{spec.num_requests} requests from dataset {opts.dataset}, {rate}{extra}"
    )
    if opts.engine.speculative is not None:
        extra_spec = f", draft {opts.engine.draft_model}" if opts.engine.draft_model else ""
        workload += f"; cb_spec: {opts.engine.speculative} speculation, K={opts.engine.num_speculative_tokens}{extra_spec}"
    if opts.url is not None:
        concurrency = opts.concurrency or spec.num_requests
        return f"sched bench: {opts.model} served at {opts.url}, {workload}, concurrency {concurrency}"
    backend = cpu_kernels(result)
    activations = f", {opts.engine.activations} activations" if result.quantized_weights else ""
    kv = f", {result.kv_cache_dtype} KV cache" if result.kv_cache_dtype else ""
    kernel_note = f" ({backend} kernels{activations}{kv})" if backend else ""
    return (
        f"sched bench: {opts.model} {opts.engine.dtype} on {result.device}, {workload}, max {opts.max_num_seqs} "
        f"seqs, {result.threads} threads{kernel_note}, {opts.repeat} repeat(s)"
    )


def table(result: BenchResult) -> Table:
    """Metrics by schedule; cells are the median across repeats, with [min-max] when they differ."""
    schedules = {k: v for k, v in schedules_json(result).items() if k != "single"}
    spec = result.options.workload
    grid = Table()
    grid.add_column("metric")
    for name, metrics in schedules.items():
        header = name
        if "requests_run" in metrics and metrics["requests_run"] != spec.num_requests:
            header += f"\n(first {metrics['requests_run']})"
        grid.add_column(header, justify="right")
    for label, get, digits in ROWS:
        cells = [get(m) for m in schedules.values()]
        if all(c is None for c in cells):
            continue
        grid.add_row(label, *[c if isinstance(c, str) else _cell(c, digits) for c in cells])
    if spec.tenants > 1:
        for tenant in sorted({t for m in schedules.values() for t in (m.get("tenant_output_tokens") or {})}):
            cells = [(m.get("tenant_output_tokens") or {}).get(tenant) for m in schedules.values()]
            grid.add_row(f"output tokens, {tenant}", *[_cell(c, 0) for c in cells])
    return grid


def footer(result: BenchResult) -> list[str]:
    """Lines under the table: what was measured how, the single-request figures, ratios, machine."""
    data = to_json(result)
    lines = []
    if "sequential" in result.runs:
        lines.append(
            f"sequential runs one request at a time over the first {SEQUENTIAL_SUBSET} requests only."
        )
    if "static" in result.runs or "hf" in result.runs:
        lines.append(
            "static and hf: batches of max-num-seqs in arrival order, each run to its longest output; a request "
            "completes when its batch does; TTFT/ITL from the times its own tokens came out."
        )
    if result.peer_info:
        loads = ", ".join(f"{k} {v['load_s']:.1f} s" for k, v in result.peer_info.items())
        lines.append(
            "subprocess peers: one process per configuration, loaded once, its repeats back to back; "
            f"load and warm-up: {loads}."
        )
    single = data["schedules"].get("single")
    if single:
        parts = [
            f"single request ({single.get('output_len')} tokens): ours (invariant) "
            f"{_single_decode(single, 'invariant')}"
        ]
        for who in ("spec", "hf", *SUBPROCESS_SCHEDULES):
            if f"{who}_decode_tps" in single:
                parts.append(f"{who} {_single_decode(single, who)}")
        lines.append(", ".join(parts))
        lines.extend(_own_benchmarks(single, result.options.long_prompts))
    for name, value in data["ratios"].items():
        lines.append(f"ratio {name}: {_cell(value, 3)}")
    for name, value in data["agreement"].items():
        versus = f"{result.options.engine.dtype} vs {result.options.compare_dtype}"
        if name.startswith("quantized_"):
            engine = result.options.engine
            versus = f"--quantize {engine.quantize} --activations {engine.activations} vs none"
        elif name.startswith("int8_kv_"):
            versus = "--kv-cache-dtype int8 vs float16"
        lines.append(f"{name} ({versus}): {value:.3f}")
    memory = data.get("memory") or {}
    if memory:
        lines.append(
            f"memory (fresh process): load + first request add {memory['added_mb']:.0f} MB RSS, KV pool "
            f"{memory['kv_pool_mb']:.0f} MB, weights held {memory['weights_held_mb']:.0f} MB; (added - KV) / "
            f"model file ({memory['model_file_mb']:.0f} MB) = {memory['added_beyond_kv_over_file']:.2f}"
        )
        lines.append(
            f"load: LLM() {memory['load_s']:.2f} s; RSS after load {memory['rss_after_load_mb']:.0f} MB, peak "
            f"{memory['rss_load_peak_mb']:.0f} MB (rule: file + KV pool + 400 MB = {memory['memory_rule_mb']:.0f}, "
            f"peak + largest tensor {memory['largest_tensor_mb']:.0f}: "
            f"{'within' if memory['rss_after_load_within_rule'] and memory['load_peak_within_rule'] else 'OVER'}); "
            f"planned (mux) {memory['planned_mb']:.0f} MB = {memory['planned_over_measured']:.3f} x measured"
        )
    if result.peak_gflops:
        peaks = ", ".join(f"{k} {v:.0f}" for k, v in result.peak_gflops.items())
        lines.append(
            f"matmul peak measured in this run (GFLOP/s): {peaks}; threads {result.threads}"
            + (
                "; on a CPU every dtype's peak is float32's (our kernels compute in float32"
                + (
                    f"; with {result.options.engine.activations} activations our quantized linears' products are integer, "
                    "so their % can pass 100)"
                    if result.quantized_weights and result.options.engine.activations != "float"
                    else ")"
                )
                if result.device == "cpu"
                else ""
            )
        )
    if result.read_gbps:
        lines.append(f"memory read bandwidth measured in this run: {result.read_gbps:.1f} GB/s")
    lines.append(f"peak RSS {result.peak_rss_mb:.0f} MB")
    if result.setup_s:
        lines.append("wall time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result.setup_s.items()))
    return lines


def _single_decode(single: dict[str, Any], who: str) -> str:
    """``42.8 decode tok/s (23.0 GB/s of weights, 64% of read bandwidth)``."""
    text = f"{_cell(single.get(f'{who}_decode_tps'), 1)} decode tok/s"
    gbps, fraction = single.get(f"{who}_decode_weights_gbps"), single.get(f"{who}_decode_bandwidth_fraction")
    if gbps is not None and fraction is not None:
        text += f" ({_cell(gbps, 1)} GB/s of weights, {_cell(_percent(fraction), 0)}% of read bandwidth)"
    return text


def _long_prefill(single: dict[str, Any], length: int) -> str:
    """--long's line for one prompt length: ours (tok/s, TTFT = tokens / tok/s) beside each peer's
    (llama.cpp's from its llama-bench, vLLM's timed by its driver: one request alone)."""

    def rate(tps: Any) -> str:
        ttft = f"{length / _median(tps):.1f} s" if tps else "n/a"
        return f"{_cell(tps, 1)} tok/s (TTFT {ttft})"

    parts = [
        f"prefill of one {length}-token prompt alone (--long): ours {rate(single[f'invariant_prefill_{length}_tps'])}"
    ]
    for who in SUBPROCESS_SCHEDULES:
        if f"{who}_prefill_{length}_tps" in single:
            source = "llama-bench" if who == "llamacpp" else who
            parts.append(f"{source} {rate(single[f'{who}_prefill_{length}_tps'])}")
    return ", ".join(parts)


def _own_benchmarks(single: dict[str, Any], long_prompts: tuple[int, ...] = ()) -> list[str]:
    """The prefill line (ours beside each peer's own benchmark) and each peer's own decode benchmark."""
    if single.get("invariant_prefill_tps") is None:
        return []
    tokens = _cell(single.get("prefill_tokens"), 0)
    parts = [
        f"prefill of one {tokens}-token prompt (tok/s): ours {_cell(single['invariant_prefill_tps'], 1)}"
    ]
    for who in SUBPROCESS_SCHEDULES:
        if f"{who}_prefill_tps" in single:
            parts.append(f"{who}'s own benchmark {_cell(single[f'{who}_prefill_tps'], 1)}")
    lines = [", ".join(parts)]
    lines += [
        _long_prefill(single, length)
        for length in long_prompts
        if f"invariant_prefill_{length}_tps" in single
    ]
    for who in SUBPROCESS_SCHEDULES:
        if f"{who}_bench_decode_tps" in single:
            lines.append(
                f"{who}'s own benchmark of one request's decode ({_cell(single[f'{who}_bench_decode_tokens'], 0)} "
                f"tokens): {_cell(single[f'{who}_bench_decode_tps'], 1)} tok/s"
            )
    ours = single.get("invariant_decode_bytes_per_token")
    if ours is not None:
        read = [f"ours {_cell(_median(ours) / 1e6, 1)} MB"]
        for who in SUBPROCESS_SCHEDULES:
            theirs = single.get(f"{who}_decode_bytes_per_token")
            if theirs is not None:
                read.append(f"{who} {_cell(_median(theirs) / 1e6, 1)} MB")
        lines.append("weight bytes one decode step reads: " + ", ".join(read))
    return lines


def _median(value: Any) -> float:
    return float(value["median"]) if isinstance(value, dict) else float(value)
