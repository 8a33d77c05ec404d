"""The serve gate's negative controls: the same asks sent through a faulty loopback proxy (the broken
input) and straight to the seat (the honest input); the gate's own checker must flag the first alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from gates.fault_proxy import FaultProxy
from gates.framework import GateRun
from gates.serve_probe import Answer, Ask, ask, compare


async def _one_per_connection(base: str, request: Ask) -> Answer:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        return await ask(client, request)


def _fault_caught(solo: dict[str, Answer], keys: list[str]) -> Callable[[list[Answer]], bool]:
    """The serve checker as a detector: some answer for ``keys`` breaks its API's contract or differs
    from its solo answer."""
    return lambda answers: bool(compare(solo, answers, keys))


async def _neg_through_proxy(
    run: GateRun, check_id: str, proxy: FaultProxy, port: int, chosen: list[Ask], solo: dict[str, Answer]
) -> None:
    """The same asks through the faulty proxy (broken) and straight to the seat (honest)."""
    with proxy as proxy_url:
        broken = list(await asyncio.gather(*(_one_per_connection(proxy_url, a) for a in chosen)))
    if proxy.injected != 1:
        run.error(check_id, RuntimeError(f"the proxy injected {proxy.injected} faults, not 1"))
        return
    honest = list(await asyncio.gather(*(_one_per_connection(f"http://127.0.0.1:{port}", a) for a in chosen)))
    keys = [a.key for a in chosen]
    problems = compare(solo, broken, keys)
    run.negative(
        check_id,
        _fault_caught(solo, keys),
        broken=broken,
        honest=honest,
        observed=f"{len(chosen)} sent, 1 fault injected; checker: {problems[0] if problems else 'saw nothing'}",
    )


async def neg_corrupted(run: GateRun, port: int, asks: list[Ask], solo: dict[str, Answer]) -> None:
    target = next(
        a for a in asks if a.stream and any(c.isascii() and c.isalnum() for c in solo[a.key].text or "")
    )
    await _neg_through_proxy(
        run, "serve.neg.corrupted_chunk", FaultProxy(port, "corrupt", nth=1), port, [target], solo
    )


async def neg_dropped(run: GateRun, port: int, asks: list[Ask], solo: dict[str, Answer]) -> None:
    chosen = [a for a in asks if a.api == "openai"][:4] + [a for a in asks if a.api == "ollama"][:2]
    await _neg_through_proxy(
        run, "serve.neg.dropped_request", FaultProxy(port, "drop", nth=3), port, chosen, solo
    )
