"""The bench's results as data: repeats aggregated (median, min, max), ratios, flat figures, the JSON.

JSON layout: ``{"device", "peer", "config", "schedules": {name: {metric: {median, min, max} | value}},
"ratios": {name: {median, min, max}}, "figures": {dotted name: number}, "machine": {"peak_gflops",
"threads"}, "peak_rss_mb", "agreement"}``. ``figures`` is flat (the census reads it): each measured
metric's median across repeats under ``<schedule>.<metric>[.<stat>]`` and each ratio as ``ratios.<name>``.
A ratio is computed per repeat (runs of one repeat are neighbours in time) and then aggregated.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nxctl.bench.options import SHORT_DTYPE
from nxctl.bench.runner import BenchResult

# constants of a schedule (the same in every repeat), not measurements
VALUE_KEYS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "requests_run",
    "output_len",
    "concurrency",
)


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


def _ratio_series(
    result: BenchResult, num: Callable[[dict], Any], den: Callable[[dict], Any], a: str, b: str
) -> list[float] | None:
    """num(a's run) / den(b's run) for each repeat; None when either side is missing or unmeasured."""
    if a not in result.runs or b not in result.runs:
        return None
    values = []
    for ra, rb in zip(result.runs[a], result.runs[b], strict=True):
        x, y = num(ra), den(rb)
        if x is None or y is None or y == 0:
            return None
        values.append(x / y)
    return values


def ratios(result: BenchResult) -> dict[str, dict[str, float]]:
    """The ratios the census and the table cite, each aggregated over repeats (absent when not measurable).

    prefix_cache_ttft_speedup = mean TTFT without the prefix cache / mean TTFT with it (--shared-prefix).
    """

    def out_tp(r: dict) -> Any:
        return r.get("output_throughput")

    def ttft_mean(r: dict) -> Any:
        return (r.get("ttft_ms") or {}).get("mean")

    opts = result.options
    series = {
        "cb_invariant_vs_hf_output_throughput": _ratio_series(result, out_tp, out_tp, "cb_invariant", "hf"),
        "cb_invariant_vs_fast_output_throughput": _ratio_series(
            result, out_tp, out_tp, "cb_invariant", "cb_fast"
        ),
        "single_invariant_vs_hf_decode_tps": _ratio_series(
            result,
            lambda r: r.get("invariant_decode_tps"),
            lambda r: r.get("hf_decode_tps"),
            "single",
            "single",
        ),
        "prefix_cache_ttft_speedup": _ratio_series(
            result, ttft_mean, ttft_mean, "cb_nocache", "cb_invariant"
        ),
    }
    if opts.compare_schedule:
        name = f"{SHORT_DTYPE[opts.dtype]}_vs_{SHORT_DTYPE[opts.compare_dtype or '']}_invariant_output_throughput"
        series[name] = _ratio_series(result, out_tp, out_tp, "cb_invariant", opts.compare_schedule)
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
    flatten("machine.peak_gflops", result.peak_gflops, figures)
    figures["peak_rss_mb"] = result.peak_rss_mb
    return {
        "device": result.device,
        "peer": result.options.peer,
        "config": result.options.to_json(),
        "schedules": schedules,
        "ratios": ratio,
        "agreement": result.extras,
        "figures": figures,
        "machine": {"peak_gflops": result.peak_gflops, "threads": result.threads},
        "peak_rss_mb": result.peak_rss_mb,
        "wall_s": result.setup_s,
    }


def write_json(result: BenchResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")
