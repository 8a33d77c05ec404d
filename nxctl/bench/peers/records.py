"""A peer's answered run as the bench's ScheduleRun: per-request records and the work its forward did.

Work, in the terms of nxctl/bench/machine.py:
- continuous peers (vLLM, llama.cpp): each request's prompt past what the peer had cached, then each
  fed-back token; forwards as the peer counted them (unknown: no GB/s);
- static peers (CTranslate2, with ``batches``): as the hf peer, each batch padded to its longest prompt
  and run to its longest output, padding included; forwards as the peer counted them, else one per
  output position.
Times come back relative to the repeat's start and are placed on the bench's clock at ``t0 = 0``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from engine.workload import WorkloadRequest
from nxctl.bench.machine import WorkCount, attended_keys
from nxctl.bench.peers.protocol import PeerRequest, PeerRun
from nxctl.bench.schedules import ScheduleRun
from nxctl.bench.serving_metrics import RequestRecord


def chunk_times(token_times: list[float] | None) -> list[float]:
    """One time per chunk of tokens that came out together (equal consecutive times collapse)."""
    if not token_times:
        return []
    return [t for i, t in enumerate(token_times) if i == 0 or t != token_times[i - 1]]


def decode_tps(answer: PeerRequest) -> float | None:
    """Decode tokens/s of one request: tokens after the first / time from the first to the last."""
    times = answer.token_times
    if not times or len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def _work(requests: Sequence[WorkloadRequest], run: PeerRun) -> WorkCount:
    if run.batches is not None:
        work = WorkCount(0, 0, 0)
        for batch in run.batches:
            width = max(len(requests[i].prompt_token_ids) for i in batch)
            longest = max(requests[i].output_len for i in batch)
            rows = len(batch) * (width + longest - 1)
            keys = len(batch) * attended_keys(0, width + longest - 1)
            work = work + WorkCount(rows, len(batch) * longest, keys, longest)
        if run.forwards is not None:  # the peer's own count (CTranslate2 feeds long prompts step by step)
            work = dataclasses.replace(work, forwards=run.forwards)
        return work
    rows = keys = 0
    for req, answer in zip(requests, run.requests, strict=True):
        end = len(req.prompt_token_ids) + req.output_len - 1
        rows += end - answer.cached_tokens
        keys += attended_keys(answer.cached_tokens, end)
    return WorkCount(rows, sum(r.output_len for r in requests), keys, run.forwards or 0)


def schedule_run(requests: Sequence[WorkloadRequest], run: PeerRun) -> ScheduleRun:
    """The bench's view of ``run`` (the answer to ``requests``, in the same order)."""
    records = [
        RequestRecord(
            arrival=req.arrival_s,
            chunk_times=chunk_times(answer.token_times),
            end=answer.end_s,
            input_tokens=len(req.prompt_token_ids),
            output_tokens=answer.generated,
            tenant=req.tenant,
            token_ids=answer.token_ids,
        )
        for req, answer in zip(requests, run.requests, strict=True)
    ]
    return ScheduleRun(records, run.duration_s, _work(requests, run))
