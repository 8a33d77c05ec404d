"""A model held for one request (never evicted meanwhile), and the streaming response that holds it
until its last byte.

    async with ModelLease(host, "tiny", KeepAlive.parse("5m")) as model:   # loads it if needed
        ...
    # leaving: the model released (kept loaded for keep_alive once idle)
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from dataclasses import dataclass, field

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.errors import CapacityError, ShuttingDownError, UnknownModelError, WaitTimeoutError
from nxctl.server.api_errors import APIError, from_engine
from nxctl.server.host import ModelHost, SeatModel
from nxctl.server.keep_alive import KeepAlive
from nxctl.server.timeline import ModelLoad, RequestTimeline

# an absolute path in a message: the seat's files are no client's business (the last part is kept)
_PATH = re.compile(r"(?<![\w.~:/])(?:/[^\s/:'\"]+)+/([^\s/:'\"]+)")


def load_failure(name: str, exc: Exception) -> APIError:
    """Why model ``name`` could not be had: 404 unknown, 503 retry later, else a server error (its
    message without the seat's file paths)."""
    if isinstance(exc, UnknownModelError | WaitTimeoutError | ShuttingDownError):
        return from_engine(exc)
    if isinstance(exc, CapacityError):
        return APIError(500, f"model '{name}' cannot be loaded: {_without_paths(str(exc))}", dead_letter=True)
    why = _without_paths(from_engine(exc).message)
    return APIError(500, f"model '{name}' failed to load: {why}", dead_letter=True)


def _without_paths(message: str) -> str:
    """``message`` with each absolute path cut to its last part."""
    return _PATH.sub(r"\1", message)


def load_set_off(model: SeatModel, since: float) -> ModelLoad | None:
    """The model's load when it began at or after ``since`` (perf_counter): an acquire that began then
    set it off. None for a model loaded before."""
    if model.load_started is None or model.load_started < since:
        return None
    return ModelLoad(model.name, model.load_started, model.load_started + model.load_seconds)


@dataclass(eq=False)
class ModelLease:
    """Holds a model busy for one request (never evicted meanwhile); ``keep_alive`` applies on release.

    Acquiring may wait for a load or for room, so it runs on ``executor`` (the seat's own pool, never
    the event loop's default one). Releasing is quick bookkeeping done on the event loop, so a release
    can never queue behind waiting acquires; only a release that unloads (keep_alive 0) uses a thread.
    A load the acquire sets off is recorded on ``timeline`` (when tracing). Entering and leaving it
    mutates ``seat``, ``load_seconds`` and ``handed_over``.
    """

    host: ModelHost
    name: str
    keep_alive: KeepAlive = field(default_factory=KeepAlive)
    timeout: float = 300
    executor: Executor | None = None
    timeline: RequestTimeline | None = None
    seat: SeatModel | None = field(default=None, init=False)  # the model while held
    load_seconds: float = field(default=0.0, init=False)  # how long the acquire took
    handed_over: bool = field(default=False, init=False)  # a streaming response releases it

    async def __aenter__(self) -> SeatModel:
        """Acquire the model (maybe loading it); an APIError when it cannot be had."""
        loop = asyncio.get_running_loop()
        started, asked = loop.time(), time.perf_counter()
        try:
            seat: SeatModel = await loop.run_in_executor(
                self.executor, self.host.acquire, self.name, self.timeout
            )
        except Exception as exc:
            raise load_failure(self.name, exc) from exc
        self.seat = seat
        self.load_seconds = loop.time() - started
        if self.timeline is not None:
            self.timeline.model_load = load_set_off(seat, asked)
        return seat

    async def __aexit__(self, *exc: object) -> None:
        """Release the model unless a streaming response took the lease over."""
        if not self.handed_over:
            await self.release()

    def hand_over(self) -> None:
        """A streaming response outlives the handler: leaving the ``async with`` no longer releases;
        the response calls ``release_soon`` when it ends."""
        self.handed_over = True

    def _keep_seconds(self) -> float | None:
        """The seconds the model stays loaded once idle (None: forever), the seat's default resolved."""
        return self.keep_alive.resolve(self.host.keep_alive_s)

    async def release(self) -> None:
        """Release the model (idempotent); waits for the unload when keep_alive is 0."""
        if self.seat is None:
            return
        self.seat = None
        keep = self._keep_seconds()
        if keep == 0:
            await asyncio.shield(asyncio.to_thread(self.host.release, self.name, keep))
        else:
            self.host.release(self.name, keep)

    def release_soon(self) -> None:
        """Release without waiting for an unload (from a stream's cleanup, maybe cancelled)."""
        if self.seat is None:
            return
        self.seat = None
        keep = self._keep_seconds()
        if keep == 0:
            asyncio.get_running_loop().run_in_executor(None, self.host.release, self.name, keep)
        else:
            self.host.release(self.name, keep)


class LeasedStream(StreamingResponse):
    """A streaming response that owns its model lease: released when the stream ends however it ends
    (finished, client gone, server shutting down), with the body iterator closed (its jobs aborted)."""

    def __init__(self, content: AsyncIterator[bytes], lease: ModelLease, media_type: str) -> None:
        super().__init__(content, media_type=media_type, headers={"Cache-Control": "no-cache"})
        lease.hand_over()
        self.lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the stream; then close its iterator and release the model, even when cancelled."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await asyncio.shield(aclose())
            self.lease.release_soon()
