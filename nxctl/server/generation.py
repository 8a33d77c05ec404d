"""A request's engine work on its model: the jobs submitted to the model's engine loop and their outputs
read back, streamed as deltas or collected as final outputs. Every generation endpoint shares it.

    deltas = stream(ctx, model, work)          # 503 now when the model's queue is full; jobs start when read
    outs = await collect(ctx, model, work)     # every job's final output, in job order

The jobs reach the loop when their outputs are first read, inside the code that aborts them on exit, so
a response that is never read leaves no job running. The engine loop sends cumulative outputs; when a
client reads slower than tokens come, the queued outputs of a job collapse into the newest one, so a
slow reader never slows the batch. A job that ends in ``error`` or ``abort`` is a server-side failure
(an APIError kept as a dead letter), a client that leaves stops the work (its jobs aborted, each counted
in the metrics with the finish the engine gives it: ``abort``), and the request's log line gets its
prompt and completion tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import Receive

from engine.errors import NxError, ShuttingDownError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from nxctl.server.answer_reader import AnswerShape
from nxctl.server.api_errors import APIError, as_api_error, from_engine
from nxctl.server.finish_reasons import failed
from nxctl.server.host import SeatModel
from nxctl.server.prometheus_metrics import SeatMetrics
from nxctl.server.request_context import RequestContext, dead_letter, note
from nxctl.server.seat import Seat
from nxctl.server.streaming import ChoiceStream, Delta
from nxctl.server.timeline import RequestTimeline

log = logging.getLogger("nxctl.serve")


@dataclass(frozen=True)
class Job:
    """One engine request: a prompt and how to sample it."""

    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class Work:
    """What one HTTP request asks of the engine: its jobs (job index = choice index) and its prompt
    tokens (counted once per prompt, not once per choice)."""

    jobs: list[Job]
    prompt_tokens: int
    shape: AnswerShape = AnswerShape()  # thinking and tool calls to read back out of the answers


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def stream(
    ctx: RequestContext[Any], model: SeatModel, work: Work, tenant: str | None = None
) -> AsyncGenerator[Delta, None]:
    """The jobs' deltas as they come (text held back while it may still become a stop string); a 503
    now, not when read, when the model's queue is full. The deltas raise only APIError, already
    recorded (dead letter, log line): the formatter turns it into the stream's error event. Closing
    them aborts the unfinished jobs."""
    return _deltas(ctx.request, submit(ctx, model, work, tenant))


async def collect(
    ctx: RequestContext[Any], model: SeatModel, work: Work, tenant: str | None = None
) -> list[RequestOutput]:
    """Every job's final output, in job order (unless the client leaves first: ClientGone); a failed
    job raises its APIError (the app's handler keeps it as a dead letter)."""
    gen = submit(ctx, model, work, tenant)
    outs = await until_disconnect(ctx.request, _finals(gen))
    for out in outs:
        if failed(out.finish_reason):
            raise failure(out)
    note(ctx.request, completion_tokens=sum(len(o.token_ids) for o in outs))
    return outs


def submit(ctx: RequestContext[Any], model: SeatModel, work: Work, tenant: str | None = None) -> Generation:
    """The request's work as a Generation on ``model`` (503 when its queue is full); the log line (and
    the timeline, when traced) gets the prompt tokens."""
    check_queue(ctx.seat, model)
    rid = ctx.request_id
    generation = Generation(model, work.jobs, rid, ctx.seat.metrics, ctx.arrival, tenant, ctx.timeline)
    if ctx.timeline is not None:
        ctx.timeline.submit(rid, model.name, work.prompt_tokens, len(work.jobs))
    note(ctx.request, prompt_tokens=work.prompt_tokens)
    return generation


def check_queue(seat: Seat, model: SeatModel) -> None:
    """503 with Retry-After when the model's queue (admitted, not started) is full."""
    if model.loop.pending >= seat.settings.max_queue:
        raise APIError(
            503,
            f"the queue of model '{model.name}' is full ({seat.settings.max_queue} requests waiting); retry later",
            headers={"Retry-After": "1"},
        )


class AsyncSink:
    """The engine loop's Sink (bridge.py) for a Generation: hands ``(index, output_or_exception)`` to
    ``receive`` on ``loop``, from the loop thread."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, receive: Callable[[int, object], None], index: int = 0
    ) -> None:
        self._loop, self._receive, self._index = loop, receive, index

    def put(self, output: RequestOutput) -> None:
        self._send(output)

    def fail(self, exc: BaseException) -> None:
        self._send(exc)

    def _send(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._receive, self._index, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


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
        self._left = False  # the reader stopped early: what the aborted jobs still send is only counted

    def _start(self) -> None:
        """Submit every job to the model's engine loop (mutates the loop's inbox); 503 if it stops."""
        loop = asyncio.get_running_loop()
        if self.timeline is not None:
            self.timeline.submitted = time.perf_counter()
        for index, job in enumerate(self.jobs):
            sink = AsyncSink(loop, self._receive, index)
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

    def _receive(self, index: int, item: object) -> None:
        """On the event loop: an output for the reader; once the reader has left, a job's final output is
        counted in the metrics instead: the engine's ``abort`` as an abort alone (no client got its tokens),
        an end it reached first as a finished request."""
        if not self._left:
            self._queue.put_nowait((index, item))
        elif isinstance(item, RequestOutput) and item.finished and self.metrics is not None:
            if item.finish_reason == "abort":
                self.metrics.observe_abort(self.model.name)
            else:  # it reached its end before the abort did
                self.metrics.observe_request(self.model.name, item, self.arrival)

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
        """Abort every job that has not finished (idempotent; thread-safe through the loop's inbox); what
        they still send is counted in the metrics (``_receive``), the outputs already queued included."""
        if not self._open:
            return
        queued = []
        while not self._queue.empty():
            queued.append(self._queue.get_nowait())
        if self.timeline is not None:
            self._record_left(self.timeline, queued)
        for index in self._open:
            self.model.loop.abort(self._ids[index])
        self._left = True
        for index, item in queued:
            if index in self._open:
                self._receive(index, item)
        self._open.clear()

    def _record_left(self, timeline: RequestTimeline, queued: list[tuple[int, object]]) -> None:
        """On the timeline (from the event loop): the open jobs' newest outputs, those ``queued`` unread
        included, and that they were left now."""
        for index, item in queued:
            if index in self._open and isinstance(item, RequestOutput):
                timeline.saw(index, item)
        now = time.perf_counter()
        for index in self._open:
            timeline.left(index, now)


def failure(out: RequestOutput) -> APIError:
    """A job that ended in ``error`` or ``abort``: a server-side failure (kept as a dead letter)."""
    if out.finish_reason == "abort":
        return APIError(503, "the request was aborted: the seat is shutting down", dead_letter=True)
    return APIError(500, f"engine error: {out.error or 'unknown'}", dead_letter=True)


async def _deltas(request: Request, gen: Generation) -> AsyncGenerator[Delta, None]:
    """The generation's deltas (see ``stream``); the log line gets the completion tokens."""
    choices = [ChoiceStream(i, job.params.stop) for i, job in enumerate(gen.jobs)]
    completion = 0
    try:
        async with aclosing(gen.outputs()) as outputs:
            async for index, out in outputs:
                if failed(out.finish_reason):
                    raise failure(out)
                if out.finished:
                    completion += len(out.token_ids)
                yield choices[index].advance(out)
    except Exception as exc:  # noqa: BLE001 - every failure reaches the client as one error event
        raise recorded(request, exc) from exc
    note(request, completion_tokens=completion)


async def _finals(gen: Generation) -> list[RequestOutput]:
    """Read the generation to its end; each job's last output."""
    finals: dict[int, RequestOutput] = {}
    async with aclosing(gen.outputs()) as outputs:
        async for index, out in outputs:
            finals[index] = out
    return [finals[i] for i in range(len(gen.jobs))]


def recorded(request: Request, exc: Exception) -> APIError:
    """An exception inside a stream, as the error to send: logged when unexpected, kept as a dead letter
    when server-side, noted on the log line."""
    err = as_api_error(exc)
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
    """Return once the client has disconnected."""
    while (await receive())["type"] != "http.disconnect":
        pass
