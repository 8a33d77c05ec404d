"""Pure-ASGI middleware (streaming-safe): one log line per request, the API key, the body size limit."""

from __future__ import annotations

import hmac
import logging
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nxctl.server.errors import APIError, error_body

log = logging.getLogger("nxctl.serve")
OPEN_PATHS = frozenset({"/health"})


class BodyTooLarge(Exception):
    """A request body over the seat's limit (answered 413)."""


async def _reject(scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
    response = JSONResponse(error_body(scope["path"], err), status_code=err.status, headers=err.headers)
    await response(scope, receive, send)


class RequestLog:
    """Logs ``METHOD PATH model=M status=S tokens=P+C latency=Ts`` once the response has ended.

    Handlers add facts through ``request.state.log`` (see handling.note)."""

    def __init__(self, app: ASGIApp, enabled: bool = True) -> None:
        self.app, self.enabled = app, enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        status = [0]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            facts = state.get("log", {})
            tokens = f"{facts.get('prompt_tokens', '-')}+{facts.get('completion_tokens', '-')}"
            error = f" error={facts['error']!r}" if facts.get("error") else ""
            log.info(
                "%s %s model=%s status=%s tokens=%s latency=%.3fs%s",
                scope["method"],
                scope["path"],
                facts.get("model", "-"),
                status[0] or "499",
                tokens,
                time.perf_counter() - started,
                error,
            )


class ApiKey:
    """When ``key`` is set, every path but /health needs ``Authorization: Bearer <key>`` (else 401)."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.key and scope["path"] not in OPEN_PATHS:
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
                err = APIError(401, "missing or wrong API key (send Authorization: Bearer <key>)")
                err.headers["WWW-Authenticate"] = "Bearer"
                await _reject(scope, receive, send, err)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuses bodies over ``max_bytes`` with 413: by Content-Length up front, or while reading."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > self.max_bytes:
            await _reject(scope, receive, send, self.too_large())
            return
        seen = [0]

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_bytes:
                    raise BodyTooLarge()
            return message

        await self.app(scope, counted, send)

    def too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_bytes} bytes")
