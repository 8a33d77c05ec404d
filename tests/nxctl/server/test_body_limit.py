"""Oversized bodies: clients read a 413 JSON error (the body is drained, within bounds, first)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from nxctl.server.app import create_app
from nxctl.server.middleware import DRAIN_LIMITS, BodyLimit, BodyTooLarge
from nxctl.server.uvicorn_seat import BackgroundSeat

LIMIT = 64 << 10


def test_the_openai_client_and_httpx_read_the_413(tmp_path: Path, tiny_settings) -> None:
    app = create_app(tiny_settings(tmp_path, max_body_bytes=LIMIT))
    with BackgroundSeat(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        content = "x" * (LIMIT * 3 // 2)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}])
        assert caught.value.status_code == 413
        error = caught.value.response.json()["error"]
        assert f"larger than {LIMIT} bytes" in error["message"] and error["type"] == "invalid_request_error"

        big = b'{"model": "tiny", "prompt": "' + b"x" * (LIMIT * 3 // 2) + b'"}'
        r = httpx.post(url + "/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and f"larger than {LIMIT} bytes" in r.json()["error"]["message"]
        assert r.headers["connection"] == "close"

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is found while reading
            for _ in range(6):
                yield b"x" * (LIMIT // 4)

        r = httpx.post(url + "/api/chat", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and f"larger than {LIMIT} bytes" in r.json()["error"]
        assert httpx.get(url + "/health").status_code == 200


def post_all_then_read(url: str, body: bytes | Iterator[bytes]) -> tuple[int, bytes]:
    """POST with urllib: it writes the whole body before it reads a byte of the answer."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_a_client_that_writes_its_whole_body_first_reads_the_413(tmp_path: Path, tiny_settings) -> None:
    limit = 1 << 20  # the body, 8 times as large, is more than the sockets' buffers hold
    app = create_app(tiny_settings(tmp_path, max_body_bytes=limit))
    with BackgroundSeat(app) as url:
        big = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * (8 * limit) + b'"}]}'
        status, body = post_all_then_read(url + "/v1/chat/completions", big)
        assert status == 413 and f"larger than {limit} bytes" in json.loads(body)["error"]["message"]

        chunks = (b"x" * (limit // 2) for _ in range(16))  # no Content-Length: sent chunked
        status, body = post_all_then_read(url + "/api/chat", chunks)
        assert status == 413 and f"larger than {limit} bytes" in json.loads(body)["error"]


class Wire:
    """An ASGI receive/send pair: a body of ``total`` bytes in ``chunk``-byte messages; records sends."""

    def __init__(self, total: int, chunk: int) -> None:
        self.left, self.chunk, self.read, self.sent = total, chunk, 0, []

    async def receive(self) -> dict[str, Any]:
        size = min(self.chunk, self.left)
        self.left -= size
        self.read += size
        return {"type": "http.request", "body": b"x" * size, "more_body": self.left > 0}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def status_and_headers(self) -> tuple[int, dict[bytes, bytes]]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return start["status"], dict(start["headers"])


def scope(headers: dict[bytes, bytes]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": list(headers.items()),
    }


async def never_called(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the app must not see an oversized body")


def test_a_declared_oversized_body_is_drained_up_to_the_bound_then_refused() -> None:
    limit = 4096
    for total, drained in ((limit * 3 // 2, limit * 3 // 2), (limit * 100, limit * DRAIN_LIMITS)):
        wire = Wire(total, 512)
        limiter = BodyLimit(never_called, limit)
        asyncio.run(limiter(scope({b"content-length": str(total).encode()}), wire.receive, wire.send))
        status, headers = wire.status_and_headers()
        assert status == 413 and headers[b"connection"] == b"close"
        assert wire.read == drained  # all of a body within the bound; never more than the bound


def test_a_client_that_expects_100_continue_gets_the_413_at_once() -> None:
    wire = Wire(1 << 20, 512)
    headers = {b"content-length": b"1048576", b"expect": b"100-continue"}
    asyncio.run(BodyLimit(never_called, 4096)(scope(headers), wire.receive, wire.send))
    assert wire.status_and_headers()[0] == 413 and wire.read == 0


def test_an_undeclared_oversized_body_is_drained_then_raises_body_too_large() -> None:
    async def reads_all(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass

    wire = Wire(1 << 20, 512)
    with pytest.raises(BodyTooLarge) as caught:
        asyncio.run(BodyLimit(reads_all, 4096)(scope({}), wire.receive, wire.send))
    assert caught.value.error.status == 413 and caught.value.error.headers["Connection"] == "close"
    assert DRAIN_LIMITS * 4096 <= wire.read <= DRAIN_LIMITS * 4096 + 512


class Stalled(Wire):
    """A client that sends one chunk of its declared body, then nothing more (it does not hang up)."""

    async def receive(self) -> dict[str, Any]:
        if self.read:
            await asyncio.Event().wait()
        return await super().receive()


def test_a_client_that_stops_sending_gets_the_413_once_the_drain_times_out() -> None:
    wire = Stalled(1 << 20, 512)
    limiter = BodyLimit(never_called, 4096, drain_s=0.2)
    asyncio.run(
        asyncio.wait_for(limiter(scope({b"content-length": b"1048576"}), wire.receive, wire.send), 10)
    )
    assert wire.status_and_headers()[0] == 413 and wire.read == 512
