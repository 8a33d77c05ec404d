"""The checks of failover on Ray Serve, shared by the failover tests and their negative control (the
fault resume-no-skip), so that the negative control runs the very checks it must make fail."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.ray_routing_checks import openai_client, seat_args

__all__ = ["USER", "failover_args", "failovers", "openai_client", "streamed_chat"]

SEED_HEADER = "x-nxctl-seed"
USER = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
FAILOVER_TIMEOUT_S = "8"


def failover_args(tmp: Path, *faults: str) -> list[str]:
    """The routing tests' seat (2 replicas of tiny, 1 thread) with the failover faults and timeout."""
    chosen = [arg for fault in faults for arg in ("--fault", fault)]
    return [*seat_args(tmp), *chosen, "--failover-timeout", FAILOVER_TIMEOUT_S]


def streamed_chat(url: str, request_id: str, seed: int | None = None) -> tuple[str, list, int]:
    """A streamed chat through the official client: its content, logprob entries and seed."""
    extra = {} if seed is None else {"seed": seed}
    # every answer 48 tokens long: a sampled one that met EOS within a chunk or two would end before the
    # replica's planned exit (a CI run met a stream that was never resumed)
    raw = openai_client(url).chat.completions.with_raw_response.create(
        model="tiny",
        messages=USER,
        max_tokens=48,
        temperature=1.0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        extra_headers={"X-Request-Id": request_id},
        extra_body={"ignore_eos": True},
        **extra,
    )
    content, entries = "", []
    for chunk in raw.parse():
        for choice in chunk.choices:
            content += choice.delta.content or ""
            entries += [e.model_dump() for e in (choice.logprobs.content if choice.logprobs else None) or []]
    return content, entries, int(raw.headers.get(SEED_HEADER, seed if seed is not None else -1))


def failovers(url: str, outcome: str) -> float:
    """The ingress's count of failovers with ``outcome``."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(f'nxctl:ingress_failovers_total{{outcome="{outcome}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no failover counter in /metrics")
