"""Security defaults of the seat: loopback unless told, an API key (compared in constant time) on every
route but /health, no CORS header unless origins are named; the testing-only fault switch is checked."""

from __future__ import annotations

import hmac
import inspect
from pathlib import Path

import httpx
import pytest

from engine.errors import InvalidRequestError
from nxctl.commands import serve as serve_cmd
from nxctl.server.app import API_MODULES, create_app
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

PREFLIGHT = {"access-control-request-method": "POST", "access-control-request-headers": "authorization"}


def test_the_seat_listens_on_loopback_unless_told_otherwise() -> None:
    defaults = inspect.signature(serve_cmd.serve).parameters
    assert defaults["host"].default == "127.0.0.1"
    assert SeatSettings().host == serve_cmd.build_settings().host == "127.0.0.1"


def test_the_api_key_guards_every_route_but_health_in_constant_time(
    tmp_path: Path, tiny_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[bytes] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    app = create_app(tiny_settings(tmp_path, api_key="s3cret"))
    every = [*app.routes, *(r for api in API_MODULES for r in api.router.routes)]
    routes = sorted(
        (method, route.path.replace("{name:path}", "tiny"))
        for route in every
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    )
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/metrics") in routes
    with BackgroundSeat(app) as url:
        for method, path in routes:
            for key in (None, "Bearer nope", "Bearer s3cre", "Bearer s3cretX", "s3cret"):
                headers = {"authorization": key} if key else {}
                r = httpx.request(method, url + path, json={}, headers=headers)
                expected = 200 if path == "/health" else 401
                assert r.status_code == expected, (method, path, key, r.status_code)
        assert compared and all(b == b"Bearer s3cret" for b in compared)
        ok = httpx.get(url + "/metrics", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_no_cors_header_unless_origins_are_named(seat) -> None:
    origin = {"origin": "https://evil.example"}
    answers = [
        httpx.options(seat.url + "/v1/chat/completions", headers={**origin, **PREFLIGHT}),
        httpx.get(seat.url + "/v1/models", headers=origin),
        httpx.post(seat.url + "/api/chat", headers=origin, content=b"not json"),
    ]
    for r in answers:
        assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers


def test_cors_answers_the_named_origins_only(tmp_path: Path, tiny_settings) -> None:
    app = create_app(tiny_settings(tmp_path, api_key="k", cors_origins=("http://localhost:3000",)))
    with BackgroundSeat(app) as url:
        ok = httpx.options(
            url + "/v1/chat/completions", headers={"origin": "http://localhost:3000", **PREFLIGHT}
        )
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = httpx.options(
            url + "/v1/chat/completions", headers={"origin": "https://evil.example", **PREFLIGHT}
        )
        assert "access-control-allow-origin" not in other.headers
        auth = {"origin": "http://localhost:3000", "authorization": "Bearer k"}
        assert httpx.get(url + "/v1/models", headers=auth).headers["access-control-allow-origin"]
        assert httpx.get(url + "/v1/models", headers={"origin": "http://localhost:3000"}).status_code == 401


@pytest.mark.parametrize(
    "bad",
    [{"faults": ("no-such-fault",)}, {"faults": ("fail-request:",)}, {"cors_origins": ("evil.example",)}],
)
def test_settings_refuse_unknown_faults_and_bare_origins(bad: dict) -> None:
    with pytest.raises(InvalidRequestError):
        SeatSettings(models=("tiny",), **bad)
