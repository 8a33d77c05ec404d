"""Prometheus metrics of the seat, with vLLM's metric names where vLLM has one (label ``model_name``).

vLLM names: num_requests_running / num_requests_waiting / kv_cache_usage_perc (gauges),
time_to_first_token_seconds / inter_token_latency_seconds / e2e_request_latency_seconds (histograms),
prompt_tokens / generation_tokens / request_success / prefix_cache_queries / prefix_cache_hits /
num_preemptions, and with speculative decoding spec_decode_num_drafts / spec_decode_num_draft_tokens /
spec_decode_num_accepted_tokens / spec_decode_num_accepted_tokens_per_pos (label ``position``; the mean
acceptance length is 1 + accepted / drafts) (counters, exposed with ``_total``). nxctl's own: model_loads, model_evictions,
dead_letters. Prefix-cache counters count tokens, as vLLM's do.
Every metric lives in a registry of its own, so several seats in one process never collide.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.outputs import RequestOutput
from nxctl.server.bridge import LoopStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's histogram buckets (seconds): both end in the same slow tail
_SLOW_TAIL = (0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, *_SLOW_TAIL)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, *_SLOW_TAIL)
_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)
M = ("model_name",)


class SeatMetrics:
    """The seat's metrics; ``observe_*`` may be called from any thread."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in the model's running batch.", M, registry=r
        )
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", M, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full).", M, registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, from arrival at the seat.",
            M,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
            M,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            M,
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", M, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", M, registry=r)
        self.success = Counter(
            "vllm:request_success",
            "Finished requests, by finish reason.",
            (*M, "finished_reason"),
            registry=r,
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries (tokens).", M, registry=r
        )
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits (tokens).", M, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions (recompute).", M, registry=r)
        self.spec_drafts = Counter(
            "vllm:spec_decode_num_drafts",
            "Speculative rounds verified (one per request per step).",
            M,
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "Tokens proposed by speculation.", M, registry=r
        )
        self.spec_accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Proposed tokens the verifier accepted.", M, registry=r
        )
        self.spec_accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Rounds whose proposed token at this position was accepted.",
            (*M, "position"),
            registry=r,
        )
        self.loads = Counter("nxctl:model_loads", "Models loaded.", M, registry=r)
        self.max_batch = Gauge(
            "nxctl:max_requests_in_step",
            "The most requests one engine step has advanced since the model loaded.",
            M,
            registry=r,
        )
        self.evictions = Counter(
            "nxctl:model_evictions", "Models unloaded, by reason.", (*M, "reason"), registry=r
        )
        self.dead_letters = Counter(
            "nxctl:dead_letters", "Requests recorded in the dead-letter store.", registry=r
        )
        self._last: dict[str, LoopStats] = {}
        self._lock = threading.Lock()

    def observe_loop(self, model: str, stats: LoopStats) -> None:
        """A loop's snapshot: gauges set, cumulative engine counters turned into increments."""
        self.running.labels(model).set(stats.running)
        self.waiting.labels(model).set(stats.waiting)
        self.kv_usage.labels(model).set(stats.kv_usage)
        self.max_batch.labels(model).set(stats.max_requests_in_step)
        with self._lock:
            last = self._last.get(model, LoopStats())
            self._last[model] = stats
        for counter, now, before in (
            (self.prefix_queries, stats.prefix_queries, last.prefix_queries),
            (self.prefix_hits, stats.prefix_hits, last.prefix_hits),
            (self.preemptions, stats.preemptions, last.preemptions),
            (self.spec_drafts, stats.spec_drafts, last.spec_drafts),
            (self.spec_draft_tokens, stats.spec_draft_tokens, last.spec_draft_tokens),
            (self.spec_accepted, stats.spec_accepted_tokens, last.spec_accepted_tokens),
        ):
            if now > before:
                counter.labels(model).inc(now - before)
        earlier = last.spec_accepted_per_pos
        for position, now_count in enumerate(stats.spec_accepted_per_pos):
            before_count = earlier[position] if position < len(earlier) else 0
            if now_count > before_count:
                self.spec_accepted_per_pos.labels(model, str(position)).inc(now_count - before_count)

    def observe_request(self, model: str, out: RequestOutput, arrival: float) -> None:
        """A finished engine request; ``arrival`` is when the seat received it (perf_counter)."""
        self.prompt_tokens.labels(model).inc(len(out.prompt_token_ids))
        self.generation_tokens.labels(model).inc(len(out.token_ids))
        self.success.labels(model, out.finish_reason or "unknown").inc()
        if out.first_token_time is not None:
            self.ttft.labels(model).observe(max(out.first_token_time - arrival, 0.0))
        times = out.token_times
        for before, after in zip(times, times[1:], strict=False):
            self.itl.labels(model).observe(after - before)
        if out.finish_time is not None:
            self.e2e.labels(model).observe(max(out.finish_time - arrival, 0.0))

    def observe_abort(self, model: str) -> None:
        """A request the engine aborted because its client left: counted as vLLM counts it
        (``request_success{finished_reason="abort"}``), its tokens not: no client received them, and the
        token totals stay the sums of what clients were answered (the soak's books balance on that)."""
        self.success.labels(model, "abort").inc()

    def observe_event(self, event: str, model: str) -> None:
        """Host events: ``load`` or ``evict:<reason>``; an unloaded model's gauges drop to zero."""
        if event == "load":
            self.loads.labels(model).inc()
            for counter in (
                self.prompt_tokens,
                self.generation_tokens,
                self.prefix_queries,
                self.prefix_hits,
            ):
                counter.labels(model)  # present from the start, at 0
            self.preemptions.labels(model)
            return
        self.evictions.labels(model, event.partition(":")[2] or "unknown").inc()
        self.observe_loop(model, LoopStats())
        with self._lock:
            self._last.pop(model, None)

    def render(self) -> bytes:
        return generate_latest(self.registry)
