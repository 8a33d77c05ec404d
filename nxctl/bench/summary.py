"""The bench's results as data: repeats aggregated (median, min, max), ratios, flat figures, the JSON.

JSON layout: ``{"device", "peer", "config", "schedules": {name: {metric: {median, min, max} | value}},
"ratios": {name: {median, min, max}}, "figures": {dotted name: number}, "machine": {"peak_gflops",
"threads", "kernels"}, "peak_rss_mb", "agreement", "peers": {schedule: what its driver said, load_s},
"skipped_peers": {peer or schedule: the line said}}``; ``peer`` is the peers named, comma-joined. ``figures`` is flat (the census reads it): each measured
metric's median across repeats under ``<schedule>.<metric>[.<stat>]`` and each ratio as ``ratios.<name>``.
A ratio is computed per repeat (runs of one repeat are neighbours in time) and then aggregated.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from engine import kernels
from nxctl.bench.bench_run import BenchResult
from nxctl.bench.figures import DECLARED_FIGURES, RATIOS, Ratio, compare_ratio, is_declared

# constants of a schedule (the same in every repeat), not measurements
VALUE_KEYS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "requests_run",
    "output_len",
    "concurrency",
)


def cpu_kernels(result: BenchResult) -> str | None:
    """The kernel backend our CPU schedules ran on (avx512_vnni, avx512, avx2, generic, portable): a verify step's
    or a batch's speed depends on it; None off the CPU and for a seat measured over HTTP."""
    if result.device != "cpu" or result.options.url is not None:
        return None
    return kernels.backend().name


def aggregate(values: list[Any]) -> Any:
    """Per-repeat values -> {median, min, max} (numbers), recursing into dicts; None stays None."""
    first = values[0]
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        return {k: aggregate([v.get(k) for v in values]) for k in first}
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not numbers or len(numbers) != len(values):
        return None
    return {"median": statistics.median(numbers), "min": min(numbers), "max": max(numbers)}


def schedules_json(result: BenchResult) -> dict[str, dict[str, Any]]:
    """Each schedule's metrics aggregated over repeats; constants kept as plain values."""
    out: dict[str, dict[str, Any]] = {}
    for name, runs in result.runs.items():
        metrics = {k: aggregate([r.get(k) for r in runs]) for k in runs[0] if k not in VALUE_KEYS}
        metrics |= {k: runs[0][k] for k in VALUE_KEYS if k in runs[0]}
        out[name] = metrics
    return out


def _metric(run: dict[str, Any], path: str) -> Any:
    """A run's metric by dotted path (``ttft_ms.mean``); None when absent."""
    value: Any = run
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _ratio_series(result: BenchResult, ratio: Ratio) -> list[float] | None:
    """The ratio for each repeat; None when either side is missing or unmeasured."""
    if ratio.over not in result.runs or ratio.under not in result.runs:
        return None
    values = []
    for ra, rb in zip(result.runs[ratio.over], result.runs[ratio.under], strict=True):
        x, y = _metric(ra, ratio.numerator), _metric(rb, ratio.denominator)
        if x is None or y is None or y == 0:
            return None
        values.append(x / y)
    return values


def ratios(result: BenchResult) -> dict[str, dict[str, float]]:
    """The declared ratios (nxctl/bench/figures.py), each aggregated over repeats; absent when not measurable."""
    opts = result.options
    declared = list(RATIOS)
    compared = compare_ratio(opts)
    if compared is not None:
        declared.append(compared)
    series = {r.name: _ratio_series(result, r) for r in declared}
    return {k: aggregate(v) for k, v in series.items() if v}


def flatten(prefix: str, value: Any, into: dict[str, float]) -> None:
    """Medians of aggregated values (and plain numbers) under dotted names."""
    if isinstance(value, dict) and set(value) == {"median", "min", "max"}:
        into[prefix] = value["median"]
    elif isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}", v, into)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        into[prefix] = value


def to_json(result: BenchResult) -> dict[str, Any]:
    """The whole JSON document (layout in the module docstring)."""
    schedules, ratio = schedules_json(result), ratios(result)
    figures: dict[str, float] = {}
    for name, metrics in schedules.items():
        flatten(name, metrics, figures)
    flatten("ratios", ratio, figures)
    flatten("agreement", result.extras, figures)
    flatten("memory", result.memory, figures)
    flatten("machine.peak_gflops", result.peak_gflops, figures)
    flatten("machine.read_gbps", result.read_gbps, figures)
    figures["peak_rss_mb"] = result.peak_rss_mb
    undeclared = sorted(k for k in figures if not is_declared(k))
    if undeclared:
        raise ValueError(f"bench figures not declared in nxctl/bench/figures.py: {', '.join(undeclared)}")
    return {
        "device": result.device,
        "peer": result.options.peer,
        "config": result.options.to_json(),
        "schedules": schedules,
        "ratios": ratio,
        "agreement": result.extras,
        "memory": result.memory,
        "figures": figures,
        "declared_figures": DECLARED_FIGURES,
        "machine": {
            "peak_gflops": result.peak_gflops,
            "read_gbps": result.read_gbps,
            "threads": result.threads,
            "kernels": cpu_kernels(result),
        },
        "quantized_weights": result.quantized_weights,
        "kv_cache_dtype": result.kv_cache_dtype,
        "peak_rss_mb": result.peak_rss_mb,
        "wall_s": result.setup_s,
        "peers": result.peer_info,
        "skipped_peers": result.skipped,
    }


def write_json(result: BenchResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")
