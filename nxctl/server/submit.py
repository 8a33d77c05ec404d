"""Stage 3 of a request: its jobs submitted to the model's engine loop, their outputs as they come.

    gen = submit(request, model, work, "chatcmpl", arrival)   # 503 when the model's queue is full
    async for index, output in gen.outputs(): ...             # submits; aborts the unfinished on exit

The jobs reach the loop when ``outputs()`` is first read, inside the code that aborts them on exit, so a
response that is never read leaves no job running. The engine loop sends cumulative outputs; when a
client reads slower than tokens come, the queued outputs of a job collapse into the newest one, so a
slow reader never slows the batch.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncGenerator

from starlette.requests import Request

from engine.errors import ShuttingDownError
from engine.outputs import RequestOutput
from nxctl.server.api_errors import APIError, as_api_error, from_engine
from nxctl.server.bridge import AsyncSink
from nxctl.server.host import SeatModel
from nxctl.server.prometheus_metrics import SeatMetrics
from nxctl.server.seat import Seat, note, seat_of
from nxctl.server.timeline import RequestTimeline, timeline_of
from nxctl.server.to_engine_params import Job, Work

_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id(request: Request, prefix: str) -> str:
    """The client's X-Request-Id when it is a plain token, else a fresh ``prefix-<hex>``."""
    given = request.headers.get("x-request-id", "")
    return given if _ID.match(given) else f"{prefix}-{uuid.uuid4().hex}"


def check_queue(seat: Seat, model: SeatModel) -> None:
    """503 with Retry-After when the model's queue (admitted, not started) is full."""
    if model.loop.pending >= seat.settings.max_queue:
        raise APIError(
            503,
            f"the queue of model '{model.name}' is full ({seat.settings.max_queue} requests waiting); retry later",
            headers={"Retry-After": "1"},
        )


class Generation:
    """The jobs of one HTTP request on one model, read as outputs (job index = choice index). When the
    request is traced, its ``timeline`` gets the jobs' outputs, and the moment a reader left them."""

    def __init__(
        self,
        model: SeatModel,
        jobs: list[Job],
        request_id: str,
        metrics: SeatMetrics | None,
        arrival: float,
        tenant: str | None = None,
        timeline: RequestTimeline | None = None,
    ) -> None:
        self.model, self.jobs, self.request_id = model, jobs, request_id
        self.metrics, self.arrival, self.tenant = metrics, arrival, tenant
        self.timeline = timeline
        self._queue: asyncio.Queue = asyncio.Queue()
        self._ids: list[str] = []
        self._open: set[int] = set()

    def _start(self) -> None:
        """Submit every job to the model's engine loop (mutates the loop's inbox); 503 if it stops."""
        loop = asyncio.get_running_loop()
        if self.timeline is not None:
            self.timeline.submitted = time.perf_counter()
        for index, job in enumerate(self.jobs):
            sink = AsyncSink(loop, self._queue, index)
            rid = f"{self.request_id}-{index}"
            try:
                self.model.loop.submit(job.prompt_ids, job.params, sink, rid, self.tenant)
            except ShuttingDownError as exc:
                self.abort()
                raise from_engine(exc) from exc
            self._ids.append(rid)
            self._open.add(index)

    async def outputs(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """``(job index, newest output)`` until every job has finished; a job that could not be added
        raises its APIError; the unfinished jobs are aborted when the reader stops early."""
        self._start()
        try:
            while self._open:
                for index, out in await self._next():
                    yield index, out
        finally:
            self.abort()

    async def _next(self) -> list[tuple[int, RequestOutput]]:
        """Wait for outputs; the newest of each open job among all that have queued, in job order."""
        batch = [await self._queue.get()]
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        latest: dict[int, RequestOutput] = {}
        for index, item in batch:
            if isinstance(item, BaseException):
                self._open.discard(index)
                raise as_api_error(item) if isinstance(item, Exception) else item
            if index in self._open:
                latest[index] = item
        for index, out in latest.items():
            if self.timeline is not None:
                self.timeline.saw(index, out)
            if out.finished:
                self._open.discard(index)
                if self.metrics is not None:
                    self.metrics.observe_request(self.model.name, out, self.arrival)
        return sorted(latest.items())

    def abort(self) -> None:
        """Abort every job that has not finished (idempotent; thread-safe through the loop's inbox)."""
        if self.timeline is not None and self._open:
            self._record_left(self.timeline)
        for index in list(self._open):
            self.model.loop.abort(self._ids[index])
        self._open.clear()

    def _record_left(self, timeline: RequestTimeline) -> None:
        """On the timeline (from the event loop): the open jobs' newest outputs, those queued unread
        included, and that they were left now."""
        while not self._queue.empty():
            index, item = self._queue.get_nowait()
            if index in self._open and not isinstance(item, BaseException):
                timeline.saw(index, item)
        now = time.perf_counter()
        for index in self._open:
            timeline.left(index, now)


def submit(
    request: Request, model: SeatModel, work: Work, prefix: str, arrival: float, tenant: str | None = None
) -> Generation:
    """The request's work as a Generation on ``model`` (503 when its queue is full); the request id is
    the client's X-Request-Id or ``prefix-<hex>``; the log line (and the timeline, when traced) gets the
    prompt tokens."""
    seat = seat_of(request)
    check_queue(seat, model)
    timeline = timeline_of(request)
    rid = request_id(request, prefix)
    generation = Generation(model, work.jobs, rid, seat.metrics, arrival, tenant, timeline)
    if timeline is not None:
        timeline.submit(rid, model.name, work.prompt_tokens, len(work.jobs))
    note(request, prompt_tokens=work.prompt_tokens)
    return generation
