"""A test double of a seat's OpenAI completions API: SSE chunks, a usage chunk, [DONE], on a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

TOKEN_GAP_S = 0.02  # the double's time between streamed tokens


def make_double(seen: list[dict]) -> FastAPI:
    """Streams ``max_tokens`` one-token chunks ``TOKEN_GAP_S`` apart; 400 for a prompt that is not token ids."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        seen.append(body)
        prompt, n = body.get("prompt"), int(body.get("max_tokens", 16))
        if not isinstance(prompt, list) or body.get("prompt") == [13]:
            return JSONResponse({"error": {"message": "bad prompt"}}, status_code=400)

        async def events():
            for i in range(n):
                await asyncio.sleep(TOKEN_GAP_S)
                choice = {"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}
                yield f"data: {json.dumps({'id': 'cmpl-1', 'object': 'text_completion', 'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@dataclass
class Seat:
    """A running double: its base URL, the request bodies it received, its gap between tokens."""

    url: str
    seen: list[dict] = field(default_factory=list)
    gap_s: float = TOKEN_GAP_S


@pytest.fixture()
def seat_double() -> Iterator[Seat]:
    """A running test double, stopped after the test."""
    seen: list[dict] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_double(seen), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the test double did not start"
    yield Seat(f"http://127.0.0.1:{port}", seen)
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
