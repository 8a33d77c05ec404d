"""One HTTP request carried from the ingress to a replica's app as data, its response back as ASGI messages.

    ingress: scope + body read -> HttpCall --Ray handle (the router picks the replica)--> replica
    replica: run_asgi(seat app, call) yields http.response.start / http.response.body messages as the
             app sends them --stream--> ingress: each message passed to its client's ``send``

The call's ``receive`` gives the body once, then waits; when the consumer stops listening (the ingress's
client left, so Ray cancels the call) it answers ``http.disconnect`` and cancels the app, as a server
does when a connection drops: the seat's handlers abort their engine jobs as they do in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope

log = logging.getLogger("nxctl.serve")


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request as data (picklable): what a replica's app needs to answer it."""

    method: str
    path: str
    query_string: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None
    scheme: str = "http"
    http_version: str = "1.1"

    def scope(self) -> Scope:
        """The ASGI HTTP scope of this request."""
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.http_version,
            "method": self.method,
            "scheme": self.scheme,
            "path": self.path,
            "raw_path": self.path.encode("utf-8"),
            "query_string": self.query_string,
            "root_path": "",
            "headers": [tuple(pair) for pair in self.headers],
            "client": self.client,
            "server": self.server,
            "state": {},
        }


def header(call: HttpCall, name: str) -> str | None:
    """The value of ``call``'s header ``name`` (the first, if several), None when it has none."""
    wanted = name.lower().encode()
    return next((v.decode("latin-1") for k, v in call.headers if k.lower() == wanted), None)


def call_of(scope: Scope, body: bytes) -> HttpCall:
    """The HttpCall of an ASGI HTTP ``scope`` whose body was read."""
    return HttpCall(
        method=scope["method"],
        path=scope["path"],
        query_string=scope.get("query_string", b""),
        headers=tuple((bytes(k), bytes(v)) for k, v in scope.get("headers") or []),
        body=body,
        client=tuple(scope["client"]) if scope.get("client") else None,  # type: ignore[arg-type]
        server=tuple(scope["server"]) if scope.get("server") else None,  # type: ignore[arg-type]
        scheme=scope.get("scheme", "http"),
        http_version=scope.get("http_version", "1.1"),
    )


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, None when the client left before it all came (``receive`` may raise:
    BodyLimit's counted receive does past its limit)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def run_asgi(app: ASGIApp, call: HttpCall) -> AsyncIterator[Message]:
    """``app``'s answer to ``call``, message by message; closing the iterator early (the consumer was
    cancelled) disconnects and cancels the app."""
    queue: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await queue.put(message)

    async def run() -> None:
        try:
            await app(call.scope(), receive, send)
        except Exception:  # noqa: BLE001 - the app's last-resort handler has answered 500 already
            log.exception("the seat's app failed on %s %s", call.method, call.path)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(run())
    try:
        while (message := await queue.get()) is not None:
            yield message
    finally:
        if not task.done():
            gone.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
