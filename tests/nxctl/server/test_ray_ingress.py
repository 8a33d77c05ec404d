"""The ingress's relay (ray_ingress.Relay) over a stand-in for the seat deployment's handle: no Ray
instance. Requests are keyed and relayed as ASGI messages; /metrics asks each replica the router names;
a refusal from every replica comes back as it came; a handle that fails every try is 503 JSON; a
generation request without a seed is given one before routing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.mux.registry import ModelSpec, Registry
from nxctl.server.asgi_relay import HttpCall
from nxctl.server.middleware import BodyLimit
from nxctl.server.replay_seed import with_seed
from nxctl.server.route_keys import RouteKey, RouteKeys

pytest.importorskip("ray.serve")

from nxctl.server.ray_ingress import Relay  # noqa: E402 - ray is an extra

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
Answer = Callable[[RouteKey, HttpCall], tuple[int, bytes]]


class FakeHandle:
    """``handle.forward.options(stream=True).remote(key, call)`` answering with ``answer``; a roster key
    gets the replicas ``r1`` and ``r2``, as the router fills it."""

    def __init__(self, answer: Answer) -> None:
        self.answer, self.calls = answer, []
        self.forward = self

    def options(self, **_: Any) -> FakeHandle:
        return self

    def remote(self, key: RouteKey, call: HttpCall) -> AsyncIterator[dict[str, Any]]:
        self.calls.append((key, call))
        if key.roster is not None:
            key.roster[:] = ["r1", "r2"]
        status, body = self.answer(key, call)

        async def messages() -> AsyncIterator[dict[str, Any]]:
            if status == 0:
                raise RuntimeError("no replica")
            yield {"type": "http.response.start", "status": status, "headers": []}
            yield {"type": "http.response.body", "body": body}

        return messages()


def ask(handle: FakeHandle, method: str, path: str, **kwargs: Any) -> httpx.Response:
    spec = ModelSpec(id=0, name="tiny", source=str(FIXTURES / "tiny"))
    app = BodyLimit(Relay(handle, RouteKeys(Registry((spec,), origin="test"))), 1 << 20)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://seat") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def test_a_request_is_keyed_and_relayed() -> None:
    handle = FakeHandle(lambda key, call: (200, b'{"ok": true}'))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi there, a few words"}]}
    r = ask(handle, "POST", "/v1/chat/completions?x=1", json=body)
    assert r.status_code == 200 and r.json() == {"ok": True}
    key, call = handle.calls[0]
    assert key.model == "tiny" and key.blocks and call.path == "/v1/chat/completions"
    assert call.query_string == b"x=1" and b"hi there" in call.body


def test_metrics_ask_every_replica_and_label_them() -> None:
    def answer(key: RouteKey, call: HttpCall) -> tuple[int, bytes]:
        return 200, f'# TYPE a_total counter\na_total{{m="x"}} {1 if key.replica == "r1" else 2}\n'.encode()

    handle = FakeHandle(answer)
    r = ask(handle, "GET", "/metrics", headers={"authorization": "Bearer k"})
    assert r.text.splitlines()[:3] == [
        "# TYPE a_total counter",
        'a_total{m="x",replica="r1"} 1',
        'a_total{m="x",replica="r2"} 2',
    ]
    assert 'nxctl:ingress_failovers_total{outcome="resumed"} 0.0' in r.text.splitlines()  # the ingress's own
    asked = [(k.replica, dict(c.headers).get(b"authorization")) for k, c in handle.calls[1:]]
    assert asked == [("r1", b"Bearer k"), ("r2", b"Bearer k")]  # each replica, the client's headers


def test_a_refusal_from_every_replica_comes_back_as_it_came() -> None:
    handle = FakeHandle(lambda key, call: (401, b'{"error": "bad key"}') if key.replica else (200, b""))
    r = ask(handle, "GET", "/metrics")
    assert r.status_code == 401 and r.json() == {"error": "bad key"}


def test_no_replica_is_503_json_and_too_large_is_413_json() -> None:
    r = ask(FakeHandle(lambda key, call: (0, b"")), "POST", "/api/chat", json={"model": "tiny"})
    assert r.status_code == 503 and "no replica" in r.json()["error"]
    r = ask(FakeHandle(lambda key, call: (200, b"")), "POST", "/v1/completions", content=b"x" * (2 << 20))
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]


def test_a_request_without_a_seed_is_given_one_before_routing_and_told_it() -> None:
    """Chat and completion requests that name no seed get one (OpenAI's top-level, Ollama's in options),
    the relayed body's length follows it, and the answer says which in x-nxctl-seed; a seed the client
    named, and other paths, are relayed as they came."""
    handle = FakeHandle(lambda key, call: (200, b"{}"))
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0}
    r = ask(handle, "POST", "/v1/chat/completions", json=chat)
    seed = int(r.headers["x-nxctl-seed"])
    call = handle.calls[-1][1]
    assert json.loads(call.body) == {**chat, "seed": seed}
    assert dict(call.headers)[b"content-length"] == str(len(call.body)).encode()
    r = ask(handle, "POST", "/api/generate", json={"model": "tiny", "prompt": "hi", "options": {"top_k": 3}})
    assert json.loads(handle.calls[-1][1].body)["options"] == {
        "top_k": 3,
        "seed": int(r.headers["x-nxctl-seed"]),
    }
    for path, body in (
        ("/v1/chat/completions", {**chat, "seed": 7}),
        ("/api/chat", {"model": "tiny", "messages": [], "options": {"seed": 0}}),
        ("/api/embed", {"model": "tiny", "input": "hi"}),
    ):
        r = ask(handle, "POST", path, json=body)
        assert "x-nxctl-seed" not in r.headers and json.loads(handle.calls[-1][1].body) == body, path
    ask(handle, "POST", "/api/chat", content=b"not json")
    assert handle.calls[-1][1].body == b"not json"


def test_with_seed_draws_from_its_source_and_keeps_what_it_cannot_read() -> None:
    body, seed = with_seed("/v1/completions", b'{"prompt": "x"}', draw=lambda bound: bound - 1)
    assert seed == 2**31 - 1 and json.loads(body) == {"prompt": "x", "seed": 2**31 - 1}
    for raw in (b"[1, 2]", b'{"options": 3}', b"\xff"):
        assert with_seed("/api/generate", raw) == (raw, None)
