"""Pure-ASGI middleware (streaming-safe): one log line per request, the API key, the body size limit."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nxctl.server.api_errors import APIError, error_body

log = logging.getLogger("nxctl.serve")
OPEN_PATHS = frozenset({"/health"})
LOGGED_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")  # a client's X-Request-Id fit for the log line


def recording_status(send: Send) -> tuple[Send, list[int]]:
    """``send`` that also notes the response's status code (in the list, 0 until the response starts)."""
    status = [0]

    async def send_status(message: Message) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        await send(message)

    return send_status, status


class BodyTooLarge(Exception):
    """A request body over the seat's limit (answered 413); ``error`` is that answer."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def too_large(max_bytes: int) -> APIError:
    """The 413 of a body over ``max_bytes``; the connection closes after it (the body was not all read)."""
    return APIError(
        413, f"the request body is larger than {max_bytes} bytes", headers={"Connection": "close"}
    )


# Why a refused body is read before its 413 goes out: the 413 closes the connection (Connection: close),
# and a socket closed with request bytes still unread, or still arriving, answers them with a reset. The
# reset throws away the 413 at a client that writes its whole body before it reads (urllib.request and
# most hand-written clients): it sees "connection reset". Reading the body to its end first, as nginx's
# lingering close does, lets every client read the 413. The bounds keep a client from making the seat
# read for nothing without end: at the default 8 MiB limit up to 128 MiB, for up to 5 s (a client that
# stops sending gets its 413 then). A body still arriving past either bound is cut off: its client may
# see a reset instead of the 413.
DRAIN_LIMITS = 16  # read at most this many times the limit of a refused body, in all
DRAIN_S = 5.0  # for at most this many seconds


async def discard_body(receive: Receive, budget: int, seconds: float = DRAIN_S) -> None:
    """Read and drop the rest of the request body: at most ``budget`` more bytes, for at most ``seconds``
    (see DRAIN_LIMITS for why)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while budget > 0:
                message = await receive()
                if message["type"] != "http.request":
                    return
                budget -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


async def _reject(scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
    """Answer with ``err`` as JSON, in the flavour of the path's API."""
    response = JSONResponse(error_body(scope["path"], err), status_code=err.status, headers=err.headers)
    await response(scope, receive, send)


class RequestLog:
    """Logs ``METHOD PATH model=M status=S tokens=P+C latency=Ts`` once the response has ended, then
    `` error='...'`` when it failed and `` id=ID`` when the client sent a plain X-Request-Id (so a client
    can find its own requests in the log).

    Handlers add facts through ``request.state.log`` (see request_context.note)."""

    def __init__(self, app: ASGIApp, enabled: bool = True) -> None:
        self.app, self.enabled = app, enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request; log its line once the response has ended (however it ended)."""
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        send_status, status = recording_status(send)
        try:
            await self.app(scope, receive, send_status)
        finally:
            facts = state.get("log", {})
            tokens = f"{facts.get('prompt_tokens', '-')}+{facts.get('completion_tokens', '-')}"
            tail = f" error={facts['error']!r}" if facts.get("error") else ""
            given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
            tail += f" id={given}" if LOGGED_ID.match(given) else ""
            log.info(
                "%s %s model=%s status=%s tokens=%s latency=%.3fs%s",
                scope["method"],
                scope["path"],
                facts.get("model", "-"),
                status[0] or "499",
                tokens,
                time.perf_counter() - started,
                tail,
            )


class ApiKey:
    """When ``key`` is set, every path but /health needs ``Authorization: Bearer <key>`` (else 401)."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """401 unless the request carries the key (or its path is open)."""
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
    """Refuses bodies over ``max_bytes`` with 413: by Content-Length up front, or while reading.

    Either way the rest of the body is read and dropped, up to DRAIN_LIMITS times the limit in all and
    for up to ``drain_s`` seconds, before the 413 goes out (then the connection closes), so that clients
    read the 413 instead of a reset connection (see DRAIN_LIMITS). A client that sent
    ``Expect: 100-continue`` gets the 413 at once: it has not sent its body."""

    def __init__(self, app: ASGIApp, max_bytes: int, drain_s: float = DRAIN_S) -> None:
        self.app, self.max_bytes, self.drain_s = app, max_bytes, drain_s
        self.drain_bytes = DRAIN_LIMITS * max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """413 for a declared length over the limit; else run the app with a counting ``receive``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > self.max_bytes:
            if headers.get(b"expect", b"").lower() != b"100-continue":
                await discard_body(receive, self.drain_bytes, self.drain_s)
            await _reject(scope, receive, send, too_large(self.max_bytes))
            return
        await self.app(scope, self._counted(receive), send)

    def _counted(self, receive: Receive) -> Receive:
        """``receive`` that raises BodyTooLarge (after draining) once the body passes the limit."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if message.get("more_body", False):
                        await discard_body(receive, self.drain_bytes - seen, self.drain_s)
                    raise BodyTooLarge(too_large(self.max_bytes))
            return message

        return counted
