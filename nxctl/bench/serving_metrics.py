"""Serving metrics with vLLM's names and definitions (``vllm bench serve``), from per-request timings.

For each completed request (times in seconds, on one clock):
- TTFT  = first streamed token (or chunk) time - the request's scheduled arrival time;
- E2EL  = completion time - arrival time (the request's latency);
- TPOT  = (E2EL - TTFT) / (output tokens - 1), only for requests with more than one output token;
- ITL   = every gap between consecutive streamed chunks of a request, pooled over all requests.
Over the run: request_throughput = completed / duration, output_throughput = output tokens / duration,
total_token_throughput = (input + output tokens) / duration. Each latency is reported in milliseconds
as mean / median / p99, percentiles by linear interpolation (numpy's default, as vLLM computes them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
STATS = ("mean", "median", "p99")


@dataclass(frozen=True)
class RequestRecord:
    """One completed request's timings. ``chunk_times``: when each streamed chunk carrying tokens arrived
    (one per token in-process); ``output_tokens``: the requested tokens it produced."""

    arrival: float
    chunk_times: list[float]
    end: float
    input_tokens: int
    output_tokens: int
    tenant: str = "default"
    token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.output_tokens >= 0 and self.input_tokens >= 0
        assert all(b >= a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False))

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.arrival if self.chunk_times else None

    @property
    def e2el(self) -> float:
        return self.end - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.output_tokens <= 1 or self.ttft is None:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """mean / median / p99 in milliseconds of durations in seconds; None for each when there are none."""
    if not values_s:
        return dict.fromkeys(STATS)
    ms = [v * 1000 for v in values_s]
    return {"mean": sum(ms) / len(ms), "median": percentile(ms, 50), "p99": percentile(ms, 99)}


def compute_metrics(
    records: Sequence[RequestRecord], duration: float, timed_chunks: bool = True
) -> dict[str, float | int | dict[str, float | None] | None]:
    """The run's metrics. ``timed_chunks=False`` (chunk times not measured) leaves TTFT, TPOT and ITL None."""
    if duration <= 0:
        raise ValueError(f"duration must be positive, got {duration}")
    output = sum(r.output_tokens for r in records)
    total = output + sum(r.input_tokens for r in records)
    ttfts = [r.ttft for r in records if r.ttft is not None] if timed_chunks else []
    tpots = [r.tpot for r in records if r.tpot is not None] if timed_chunks else []
    itls = [gap for r in records for gap in r.itls] if timed_chunks else []
    return {
        "duration": duration,
        "completed": len(records),
        "total_input_tokens": total - output,
        "total_output_tokens": output,
        "request_throughput": len(records) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": total / duration,
        "ttft_ms": summarize_ms(ttfts),
        "tpot_ms": summarize_ms(tpots),
        "itl_ms": summarize_ms(itls),
        "e2el_ms": summarize_ms([r.e2el for r in records]),
    }
