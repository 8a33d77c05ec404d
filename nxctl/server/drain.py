"""Draining at shutdown: the requests in flight are counted, and once the seat drains every new request
is answered 503 with a JSON error (and ``Connection: close``) while those in flight finish.

    state = DrainState()                 # one per seat (``Seat.drain``)
    app = Drain(app, state)              # the ASGI middleware that counts and refuses
    state.draining = True                # SeatServer.shutdown, on SIGTERM / SIGINT / stop()
    while state.in_flight: ...           # it waits for them (up to the drain timeout)

Everything runs on the event loop's thread, so the counter needs no lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nxctl.server.api_errors import RETRY_AFTER_S, APIError, error_body
from nxctl.server.middleware import discard_body

REFUSED_BODY_BYTES = 1 << 20  # what a refused request's body may still be read (so the client reads the 503)


@dataclass
class DrainState:
    """Whether the seat drains, and how many HTTP requests it is serving (mutated by ``Drain``)."""

    draining: bool = False
    in_flight: int = 0


def draining_error() -> APIError:
    """The 503 of a request that arrives while the seat drains."""
    return APIError(
        503,
        "the seat is shutting down: it finishes the requests in flight and takes no new ones; retry later",
        headers={"Retry-After": RETRY_AFTER_S, "Connection": "close"},
    )


class Drain:
    """Counts the HTTP requests in flight (until their response ends); while ``state.draining``, answers
    new ones 503 in the JSON of their API without running them."""

    def __init__(self, app: ASGIApp, state: DrainState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse when draining; else run the request, counted while it runs."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.state.draining:
            await discard_body(receive, REFUSED_BODY_BYTES)
            err = draining_error()
            response = JSONResponse(error_body(scope["path"], err), status_code=503, headers=err.headers)
            await response(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1
