"""What every generation handler shares: the seat's state, body parsing, the queue limit, dead letters,
client disconnects, and streams that hold their model until the last byte."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.errors import NxError
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.errors import APIError, bad_request, from_engine, from_validation
from nxctl.server.generation import ModelLease
from nxctl.server.host import ModelHost, SeatModel
from nxctl.server.metrics import SeatMetrics
from nxctl.server.settings import SeatSettings

log = logging.getLogger("nxctl.serve")
T = TypeVar("T", bound=BaseModel)


@dataclass
class Seat:
    """Everything the handlers share (``app.state.seat``)."""

    settings: SeatSettings
    host: ModelHost
    metrics: SeatMetrics
    dlq: DeadLetterStore | None
    started: float = 0.0  # wall clock
    acquirer: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=64, thread_name_prefix="nxctl-acquire")
    )

    def lease(self, name: str, keep_alive: float | None | str = "default") -> ModelLease:
        """A lease on model ``name`` for one request (acquired on the seat's own thread pool)."""
        return ModelLease(self.host, name, keep_alive, self.settings.load_timeout_s, self.acquirer)


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def seat_of(request: Request) -> Seat:
    return request.app.state.seat


def note(request: Request, **fields: Any) -> None:
    """Facts for the request's log line (model, prompt_tokens, completion_tokens)."""
    request.state.log = {**getattr(request.state, "log", {}), **fields}


async def parse_body(request: Request, schema: type[T]) -> T:
    """The JSON body validated against ``schema`` (then its ``check()``); every problem is a clear 400."""
    raw = await request.body()
    request.state.body = raw
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise bad_request(f"the body must be a JSON object, got {type(data).__name__}")
    if isinstance(data.get("model"), str):
        note(request, model=data["model"])
    try:
        parsed = schema.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc) from exc
    check = getattr(parsed, "check", None)
    if check is not None:
        check()
    return parsed


def check_queue(seat: Seat, model: SeatModel) -> None:
    """503 with Retry-After when the model's queue (admitted, not started) is full."""
    if model.loop.pending >= seat.settings.max_queue:
        raise APIError(
            503,
            f"the queue of model '{model.name}' is full ({seat.settings.max_queue} requests waiting); retry later",
            headers={"Retry-After": "1"},
        )


def dead_letter(request: Request, status: int, reason: str) -> None:
    """Record a server-side failure of ``request`` in the dead-letter store (never raises)."""
    seat = seat_of(request)
    if seat.dlq is None:
        return
    model = getattr(request.state, "log", {}).get("model")
    try:
        seat.dlq.record(
            method=request.method,
            path=request.url.path,
            status=status,
            reason=reason,
            model=model,
            body=getattr(request.state, "body", None),
        )
        seat.metrics.dead_letters.inc()
    except Exception:  # noqa: BLE001 - the store failing must not hide the request's own error
        log.exception("could not record a dead letter")


def stream_failure(request: Request, exc: Exception) -> APIError:
    """An exception inside a stream, as the error to send: server-side ones become dead letters."""
    err = exc if isinstance(exc, APIError) else from_engine(exc)
    if not isinstance(exc, APIError | NxError):
        log.error("stream of %s failed", request.url.path, exc_info=exc)
    if err.dead_letter:
        dead_letter(request, err.status, err.message)
    note(request, error=err.message)
    return err


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await ``work`` unless the client disconnects first (then cancel it and raise ClientGone)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone()
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class LeasedStream(StreamingResponse):
    """A streaming response that owns its model lease: released when the stream ends however it ends
    (finished, client gone, server shutting down), with the body iterator closed (its jobs aborted)."""

    def __init__(self, content: AsyncIterator[bytes], lease: ModelLease, media_type: str) -> None:
        super().__init__(content, media_type=media_type, headers={"Cache-Control": "no-cache"})
        lease.hand_over()
        self.lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await asyncio.shield(aclose())
            self.lease.release_soon()
