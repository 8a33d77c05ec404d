"""The workload over a running seat's OpenAI completions API, timed from the SSE stream as vLLM does.

Each request is sent at its scheduled arrival (at most ``concurrency`` in flight) as
``POST {url}/v1/completions`` with the prompt as a list of token ids, ``max_tokens``, ``temperature: 0``,
``ignore_eos`` as the workload sets it (true for random prompts; a ``--workload`` dataset's requests stop
at EOS) and ``stream: true`` with usage. Like ``vllm bench serve``: every data chunk that
carries ``choices`` is a streamed chunk (its arrival time gives TTFT and ITL), the usage chunk gives the
output token count; TTFT and latency count from the scheduled arrival, not from the send.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence

import httpx

from engine.errors import NxError
from engine.workload import WorkloadRequest
from nxctl.bench.machine import WorkCount
from nxctl.bench.schedules import Advance, ScheduleRun
from nxctl.bench.serving_metrics import RequestRecord
from nxctl.stream_lines import aiter_stream_lines

TIMEOUT_S = 600.0


def completion_payload(model: str, req: WorkloadRequest) -> dict[str, object]:
    """The request body for one workload request."""
    return {
        "model": model,
        "prompt": list(req.prompt_token_ids),
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "ignore_eos": req.params.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _one(
    client: httpx.AsyncClient, url: str, model: str, req: WorkloadRequest, arrival: float, advance: Advance
) -> RequestRecord:
    times: list[float] = []
    output_tokens: int | None = None
    async with client.stream("POST", f"{url}/v1/completions", json=completion_payload(model, req)) as resp:
        if resp.status_code != 200:
            body = (await resp.aread()).decode(errors="replace")
            raise NxError(f"{url} answered HTTP {resp.status_code} to request {req.index}: {body[:200]}")
        async for line in aiter_stream_lines(resp):
            line = line.strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                times.append(time.perf_counter())
                advance(1)
            elif chunk.get("usage"):
                output_tokens = int(chunk["usage"].get("completion_tokens", 0))
    end = time.perf_counter()
    return RequestRecord(
        arrival=arrival,
        chunk_times=times,
        end=end,
        input_tokens=len(req.prompt_token_ids),
        output_tokens=len(times) if output_tokens is None else output_tokens,
        tenant=req.tenant,
    )


async def _run(
    url: str, model: str, requests: Sequence[WorkloadRequest], concurrency: int, advance: Advance
) -> ScheduleRun:
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()

        async def send(req: WorkloadRequest) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
            async with limit:
                return await _one(client, url, model, req, t0 + req.arrival_s, advance)

        records = await asyncio.gather(*(send(r) for r in requests))
    duration = max(r.end for r in records) - t0
    return ScheduleRun(list(records), duration, WorkCount(0, 0, 0))


def run_http(
    url: str, model: str, requests: Sequence[WorkloadRequest], concurrency: int, advance: Advance
) -> ScheduleRun:
    """Drive the workload against the seat at ``url``; NxError when it cannot be reached or refuses."""
    if concurrency < 1:
        raise NxError(f"--concurrency must be >= 1, got {concurrency}")
    try:
        return asyncio.run(_run(url.rstrip("/"), model, requests, concurrency, advance))
    except httpx.HTTPError as exc:
        raise NxError(f"cannot complete requests at {url}: {type(exc).__name__}: {exc}") from None
