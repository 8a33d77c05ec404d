"""Requests a seat must refuse with a 4xx JSON error in its API's flavour (and no CORS header), never
serve, fail on or crash on: bodies that are not JSON, fields of the wrong type, bodies over the size
limit, model names that try to leave the model store, a context too long, a missing or wrong API key,
a browser's cross-origin request, an unknown route or method."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from nxctl.soak.outcome import Sent
from nxctl.soak.prompts import words

ESCAPING_NAMES = (
    "../x",
    "../../etc/passwd",
    "/etc/passwd",
    "%2e%2e/x",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "..\\..\\x",
    "tiny/../../x",
    "~/.ssh/id_rsa",
    "tiny:../../x",
)
OVERSIZED_BYTES = 3 << 19  # 1.5 MiB, over the seat's 1 MiB limit
CHAT, OLLAMA_CHAT, SHOW = "/v1/chat/completions", "/api/chat", "/api/show"
Content = bytes | AsyncIterator[bytes]


@dataclass(frozen=True)
class Hostile:
    """One hostile request and the statuses that may answer it."""

    name: str
    method: str
    path: str
    expected: frozenset[int]
    content: Content | None = None
    headers: dict[str, str] = field(default_factory=dict)
    authorized: bool = True


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


def _user(tag: str, text: str = "hello") -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{tag} {text}"}]


async def _chunks(total: int, size: int = 1 << 16) -> AsyncIterator[bytes]:
    """A body without Content-Length (chunked), ``total`` bytes of an unfinished JSON string."""
    yield b'{"model": "tiny", "messages": "'
    for _ in range(total // size):
        yield b"a" * size


def draw(rng: random.Random, tag: str, model: str) -> Hostile:
    """One hostile request, drawn with ``rng``; ``tag`` goes into its text where it has any."""
    choice = rng.randrange(14)
    bad = frozenset({400})
    body: dict[str, Any]
    if choice == 0:
        return Hostile("bad_json", "POST", CHAT, bad, b'{"model": "tiny", "messages": [' + tag.encode())
    if choice == 1:
        return Hostile("bad_json_ollama", "POST", OLLAMA_CHAT, bad, b"not json " + tag.encode())
    if choice == 2:
        body = {"model": model, "messages": f"{tag} not a list"}
        return Hostile("wrong_type_messages", "POST", CHAT, bad, _json(body))
    if choice == 3:
        body = {"model": model, "messages": _user(tag), "max_tokens": "ten", "temperature": "hot"}
        return Hostile("wrong_type_fields", "POST", CHAT, bad, _json(body))
    if choice == 4:
        body = {"model": model, "messages": _user(tag), "options": {"num_predict": "many"}}
        return Hostile("wrong_type_options", "POST", OLLAMA_CHAT, bad, _json(body))
    if choice == 5:
        body = {"model": [model], "prompt": [f"{tag} a"], "stream": "yes"}
        return Hostile("wrong_type_generate", "POST", "/api/generate", bad, _json(body))
    if choice == 6:
        big = b'{"model": "tiny", "messages": "' + b"a" * OVERSIZED_BYTES + b'"}'
        return Hostile("oversized", "POST", rng.choice((CHAT, OLLAMA_CHAT)), frozenset({413}), big)
    if choice == 7:
        path = rng.choice((CHAT, OLLAMA_CHAT))
        return Hostile("oversized_chunked", "POST", path, frozenset({413}), _chunks(OVERSIZED_BYTES))
    if choice == 8:
        name = rng.choice(ESCAPING_NAMES)
        path = rng.choice((CHAT, OLLAMA_CHAT))
        body = {"model": name, "messages": _user(tag), "stream": False}
        return Hostile("escaping_model_name", "POST", path, frozenset({404}), _json(body))
    if choice == 9:
        name = rng.choice(ESCAPING_NAMES)
        if rng.random() < 0.5:
            return Hostile("escaping_show", "POST", SHOW, frozenset({404}), _json({"model": name}))
        encoded = name.replace("%", "%25").replace(".", "%2e").replace("/", "%2f")
        return Hostile("escaping_model_path", "GET", f"/v1/models/{encoded}", frozenset({404}))
    if choice == 10:
        body = {"model": model, "messages": _user(tag, words(rng, 400)), "max_tokens": 4000}
        return Hostile("context_too_long", "POST", CHAT, bad, _json(body))
    if choice == 11:
        path = rng.choice(("/v1/models", "/metrics", "/api/tags", CHAT))
        wrong = rng.random() < 0.5
        headers = {"authorization": "Bearer not-the-key"} if wrong else {}
        content = _json({"model": model, "messages": _user(tag)}) if path == CHAT else None
        method = "POST" if path == CHAT else "GET"
        return Hostile("no_api_key", method, path, frozenset({401}), content, headers, authorized=False)
    if choice == 12:
        headers = {"origin": "https://evil.example", "access-control-request-method": "POST"}
        return Hostile("cors_preflight", "OPTIONS", CHAT, frozenset({401, 405}), None, headers, False)
    path, method = rng.choice((("/v1/nothing-here", "GET"), ("/api/chat", "GET"), ("/v1/models", "POST")))
    return Hostile("unknown_route", method, path, frozenset({404, 405}), None)


def _error_json(path: str, response: httpx.Response) -> bool:
    """Whether ``response`` is a JSON error in the flavour of ``path``'s API."""
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    if path.startswith("/api/"):
        return isinstance(error, str) and bool(error)
    return isinstance(error, dict) and isinstance(error.get("message"), str)


async def send(http: httpx.AsyncClient, api_key: str, hostile: Hostile, sent: Sent) -> None:
    """Send ``hostile``; ``sent`` gets its status, and ``contract_ok`` says whether the answer was an
    expected status with a JSON error and no CORS header."""
    headers = {"content-type": "application/json", **hostile.headers}
    if hostile.authorized:
        headers["authorization"] = f"Bearer {api_key}"
    origin = {"origin": "https://evil.example"} if "origin" not in headers else {}
    response = await http.request(
        hostile.method, hostile.path, content=hostile.content, headers={**headers, **origin}
    )
    sent.status = response.status_code
    sent.outcome = "refused" if 400 <= response.status_code < 500 else "failed"
    if response.status_code < 400:
        sent.outcome = "completed"
    cors = any(h.lower().startswith("access-control-") for h in response.headers)
    sent.contract_ok = (
        response.status_code in hostile.expected and _error_json(hostile.path, response) and not cors
    )
    if not sent.contract_ok:
        sent.detail = f"{hostile.name}: {response.status_code} {response.text[:200]!r}"
