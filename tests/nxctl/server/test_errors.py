"""Bad input never takes the seat down: every bad request gets a 4xx JSON error with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from nxctl.server.app import create_app
from nxctl.server.uvicorn_seat import BackgroundSeat

USER = [{"role": "user", "content": "hi"}]
CASES = [
    # (path, body, status, words the message must contain)
    ("/v1/chat/completions", "{not json", 400, "malformed JSON"),
    ("/v1/chat/completions", "", 400, "empty"),
    ("/v1/chat/completions", "[1, 2]", 400, "JSON object"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages: Field required"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "at least 1 item"),
    ("/v1/chat/completions", {"model": "tiny", "messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user"}]}, 400, None),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "role",
    ),
    ("/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "tiny", "messages": USER, "temperature": True}, 400, "temperature"),
    ("/v1/chat/completions", {"model": 7, "messages": USER}, 400, "model"),
    ("/v1/chat/completions", {"model": "nope", "messages": USER}, 404, "model 'nope' not found"),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "max_tokens": 5000},
        400,
        "max_tokens is too large",
    ),
    ("/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "tiny", "messages": USER, "temperature": -0.5}, 400, "temperature"),
    ("/v1/chat/completions", {"model": "tiny", "messages": USER, "top_p": 0}, 400, "top_p"),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "tools": [{"type": "function"}]},
        400,
        "tools.0.function",
    ),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "response_format": {"type": "xml"}},
        400,
        "response_format",
    ),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "frobnicate": 1},
        400,
        "'frobnicate' (unknown field)",
    ),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "stop": ["a", "b", "c", "d", "e"]},
        400,
        "stop",
    ),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "x " * 3000}]},
        400,
        "maximum context length",
    ),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": [99999]}, 400, "token ids"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "echo": True}, 400, "echo"),
    ("/v1/embeddings", {"model": "tiny", "input": ""}, 400, "input"),
    ("/api/chat", {"model": "tiny", "messages": USER, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"model": "tiny", "messages": USER, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/api/chat", {"model": "tiny", "messages": USER, "options": {"num_gpu": 1}}, 400, "num_gpu"),
    ("/api/chat", {"model": "tiny", "messages": USER, "options": {"temperature": -1}}, 400, "temperature"),
    (
        "/api/chat",
        {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
        400,
        "images",
    ),
    ("/api/chat", {"model": "tiny", "messages": USER, "keep_alive": "soon"}, 400, "keep_alive"),
    ("/api/chat", {"model": "nope", "messages": USER}, 404, "not found"),
    ("/api/generate", {"model": "tiny", "prompt": 5}, 400, "prompt"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"mirostat": 2}}, 400, "mirostat"),
    ("/api/show", {}, 400, "model"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "words"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_bad_request_gets_a_clear_json_error(seat, path: str, body, status: int, words: str | None) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(seat.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    message = error if path.startswith("/api/") else error["message"]
    assert isinstance(message, str) and message
    if words:
        assert words in message
    assert httpx.get(seat.url + "/health").status_code == 200


def test_neutral_values_of_unsupported_fields_are_accepted(seat) -> None:
    body = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 2,
        "response_format": {"type": "text"},
        "tools": [],
    }
    assert httpx.post(seat.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    body = {"model": "tiny", "messages": USER, "options": {"num_predict": 2, "mirostat": 0}, "stream": False}
    assert httpx.post(seat.url + "/api/chat", json=body, timeout=30).status_code == 200


def test_unknown_route_and_method_are_json(seat) -> None:
    r = httpx.get(seat.url + "/v1/nothing")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = httpx.get(seat.url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]
    r = httpx.get(seat.url + "/api/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)


def test_oversized_body_is_refused_with_413(seat) -> None:
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * (9 << 20)}]})
    r = httpx.post(
        seat.url + "/v1/chat/completions", content=big, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(10):
            yield b"x" * (1 << 20)

    r = httpx.post(seat.url + "/api/chat", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    assert httpx.get(seat.url + "/health").status_code == 200


def test_api_key_is_required_when_set(tmp_path: Path, tiny_settings) -> None:
    app = create_app(tiny_settings(tmp_path, api_key="s3cret"))
    with BackgroundSeat(app) as url:
        assert httpx.get(url + "/health").status_code == 200  # open, for probes
        r = httpx.get(url + "/v1/models")
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert httpx.get(url + "/api/tags", headers={"authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(url + "/v1/models", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
