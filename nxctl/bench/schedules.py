"""The schedules the bench compares, each driving a fresh Engine over the same workload.

- continuous (``cb_invariant``, ``cb_fast``, ``cb_nocache``): requests join the engine when they arrive
  and leave when done; the engine batches whatever is running at each step.
- static: batches of ``batch_size`` in arrival order; a batch starts when the previous one has finished
  and its last member has arrived; every member runs to the batch's longest output (the padding a
  static server pays) and completes when its batch completes. Only each request's own requested
  tokens count as output; its TTFT and ITL come from the times its own tokens were produced.
- sequential: static with batches of one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.drive import drive
from engine.errors import NxError
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.outputs import RequestOutput
from engine.workload import WorkloadRequest
from nxctl.bench.machine import WorkCount, attended_keys
from nxctl.bench.serving_metrics import RequestRecord

Advance = Callable[[int], object]  # called with the number of requested output tokens just produced


@dataclass
class ScheduleRun:
    """One schedule's run: per-request records, wall time, the work the forward did, engine counters."""

    records: list[RequestRecord]
    duration: float
    work: WorkCount
    counters: dict[str, float | None] = field(default_factory=dict)


def make_engine(loaded: LoadedModel, config: EngineConfig) -> Engine:
    """A fresh engine (empty prefix cache, zeroed counters) over already-loaded weights."""
    return Engine(loaded, config)


def _progress(wanted: dict[int, int], advance: Advance) -> Callable[[RequestOutput], None]:
    """An on_output hook: progress advances by requested tokens; a request that failed stops the bench."""

    def on_output(out: RequestOutput) -> None:
        index = int(out.request_id)
        if len(out.token_ids) <= wanted[index]:
            advance(1)
        if out.finished and out.finish_reason not in ("length", "stop"):
            raise NxError(f"bench request {index} ended with {out.finish_reason}: {out.error}")

    return on_output


def _wait_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def _record(req: WorkloadRequest, out: RequestOutput, t0: float, end: float | None) -> RequestRecord:
    """The request's record; ``end`` None = it completed with its last requested token."""
    n = min(req.output_len, len(out.token_ids))
    times = out.token_times[:n]
    return RequestRecord(
        arrival=t0 + req.arrival_s,
        chunk_times=times,
        end=times[-1] if end is None else end,
        input_tokens=len(req.prompt_token_ids),
        output_tokens=n,
        tenant=req.tenant,
        token_ids=list(out.token_ids[:n]),
    )


def _attention_work(outs: Sequence[RequestOutput]) -> int:
    """Keys attended by every computed row (prompt past its cached part, then each fed-back token)."""
    total = 0
    for out in outs:
        end = len(out.prompt_token_ids) + len(out.token_ids) - 1
        total += attended_keys(out.num_cached_tokens, end)
    return total


def _finish(
    engine: Engine, records: list[RequestRecord], outs: list[RequestOutput], t0: float
) -> ScheduleRun:
    duration = max(r.end for r in records) - t0
    snap = engine.snapshot()
    st = snap.counters
    work = WorkCount(st.tokens_computed, st.tokens_generated, _attention_work(outs), st.steps)
    counters: dict[str, float | None] = {
        "steps": st.steps,
        "tokens_computed": st.tokens_computed,
        "preemptions": st.preemptions,
        "prefix_cache_queries": snap.prefix_queries,
        "prefix_cache_hits": snap.prefix_hits,
        "max_requests_in_step": st.max_requests_in_step,
    }
    if st.spec_drafts:  # vLLM's spec_decode figures
        counters |= {
            "spec_drafts": st.spec_drafts,
            "spec_draft_tokens": st.spec_draft_tokens,
            "spec_accepted_tokens": st.spec_accepted_tokens,
            "spec_acceptance_rate": st.spec_acceptance_rate,
            "spec_mean_acceptance_length": st.spec_mean_accepted_length,
        }
    return ScheduleRun(records, duration, work, counters)


def run_continuous(engine: Engine, requests: Sequence[WorkloadRequest], advance: Advance) -> ScheduleRun:
    """Continuous batching: each request is added at its arrival time, the engine steps while any runs."""
    wanted = {r.index: r.output_len for r in requests}
    result = drive(
        engine, [r.arrival() for r in requests], clock="wall", on_output=_progress(wanted, advance)
    )
    finals = {int(rid): out for rid, out in result.finals.items()}
    outs = [finals[r.index] for r in requests]
    records = [_record(r, finals[r.index], result.start, None) for r in requests]
    return _finish(engine, records, outs, result.start)


def run_static(
    engine: Engine, requests: Sequence[WorkloadRequest], batch_size: int, advance: Advance
) -> ScheduleRun:
    """Static batching (see the module docstring); ``batch_size`` 1 is the sequential schedule."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    on_output = _progress({r.index: r.output_len for r in requests}, advance)
    finals: dict[int, RequestOutput] = {}
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    for first in range(0, len(ordered), batch_size):
        batch = ordered[first : first + batch_size]
        _wait_until(t0 + batch[-1].arrival_s)
        longest = max(r.output_len for r in batch)
        padded = [
            dataclasses.replace(r, arrival_s=0.0, params=dataclasses.replace(r.params, max_tokens=longest))
            for r in batch
        ]
        arrivals = [r.arrival() for r in padded]
        finals.update(
            {int(rid): out for rid, out in drive(engine, arrivals, on_output=on_output).finals.items()}
        )
        batch_end = time.perf_counter()
        records += [_record(r, finals[r.index], t0, batch_end) for r in batch]
    outs = [finals[r.index] for r in ordered]
    return _finish(engine, records, outs, t0)


def decode_tokens_per_s(record: RequestRecord) -> float | None:
    """Decode speed of one request: tokens after the first / time from the first to the last."""
    times = record.chunk_times
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def decode_throughput(records: Sequence[RequestRecord]) -> float | None:
    """Decode speed of a run: every request's tokens after its first over its time after its first
    (None when no request has two tokens)."""
    pairs = [
        (len(r.chunk_times) - 1, r.chunk_times[-1] - r.chunk_times[0])
        for r in records
        if len(r.chunk_times) > 1
    ]
    seconds = sum(s for _, s in pairs)
    return sum(n for n, _ in pairs) / seconds if seconds > 0 else None
