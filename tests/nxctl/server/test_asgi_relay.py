"""A request carried to an app as data and its answer back as ASGI messages (asgi_relay), without Ray;
and the replica named on every span (tracing's service.instance.id)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from nxctl.server.asgi_relay import HttpCall, call_of, run_asgi
from nxctl.server.tracing import provider_from_env


def relay_app(events: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"body": (await request.body()).decode(), "q": request.url.query})

    async def slow(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                for n in range(1000):
                    yield f"{n}\n".encode()
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                events.append("cancelled")
                raise

        return StreamingResponse(chunks())

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/slow", slow)])


def test_an_answer_comes_back_as_the_apps_messages() -> None:
    scope = {"type": "http", "method": "POST", "path": "/echo", "query_string": b"a=1", "headers": []}
    call = call_of(scope, b"hello")

    async def collect() -> list[dict]:
        return [m async for m in run_asgi(relay_app([]), call)]

    messages = asyncio.run(collect())
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    assert b'"body":"hello"' in b"".join(m.get("body", b"") for m in messages[1:])
    assert b'"q":"a=1"' in messages[1]["body"]


def test_a_consumer_that_stops_cancels_the_app() -> None:
    events: list[str] = []

    async def first_three() -> None:
        stream = run_asgi(relay_app(events), HttpCall("GET", "/slow"))
        got = [await anext(stream) for _ in range(3)]  # start, then two chunks
        assert got[0]["type"] == "http.response.start"
        await stream.aclose()  # what a cancelled Ray call does to the replica's generator

    asyncio.run(first_three())
    assert events == ["cancelled"]


def test_spans_carry_the_replica() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    provider = provider_from_env(env, instance="replica-7")
    assert provider is not None
    assert provider.resource.attributes["service.instance.id"] == "replica-7"
    assert provider.resource.attributes["nxctl.replica"] == "replica-7"
    provider.shutdown()
    plain = provider_from_env(env)
    assert plain is not None and "nxctl.replica" not in plain.resource.attributes
    plain.shutdown()
