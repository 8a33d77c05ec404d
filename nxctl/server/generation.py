"""One HTTP request as engine requests: hold the model, submit the jobs, stream deltas, abort on exit.

    async with ModelLease(host, "tiny", keep_alive) as seat:       # loads it if needed (worker thread)
        gen = Generation(seat, jobs, "chatcmpl-1", metrics, arrival)
        async for delta in gen.deltas(): ...                        # or: outs = await gen.finals()
    # leaving (normally, on error, on client disconnect): unfinished jobs aborted, the model released

The engine loop sends cumulative outputs; when a client reads slower than tokens come, the queued
outputs of a job collapse into the newest one, so a slow reader never slows the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from dataclasses import dataclass

from engine.errors import CapacityError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from nxctl.server.bridge import AsyncSink
from nxctl.server.errors import APIError, from_engine
from nxctl.server.host import ModelHost, SeatModel
from nxctl.server.metrics import SeatMetrics
from nxctl.server.streaming import ChoiceStream, Delta


@dataclass(frozen=True)
class Job:
    """One engine request: a prompt and how to sample it."""

    prompt_ids: list[int]
    params: SamplingParams


class ModelLease:
    """Holds a model busy for one request (never evicted meanwhile); ``keep_alive`` applies on release.

    Acquiring may wait for a load or for room, so it runs on ``executor`` (the seat's own pool, never
    the event loop's default one). Releasing is quick bookkeeping done on the event loop, so a release
    can never queue behind waiting acquires; only a release that unloads (keep_alive 0) uses a thread.
    """

    def __init__(
        self,
        host: ModelHost,
        name: str,
        keep_alive: float | None | str = "default",
        timeout: float = 300,
        executor: Executor | None = None,
    ):
        self.host, self.name, self.keep_alive, self.timeout = host, name, keep_alive, timeout
        self.executor = executor
        self.seat: SeatModel | None = None
        self.load_seconds = 0.0
        self.handed_over = False

    async def __aenter__(self) -> SeatModel:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            self.seat = await loop.run_in_executor(self.executor, self.host.acquire, self.name, self.timeout)
        except CapacityError as exc:
            if "gave up waiting" in str(exc) or "shutting down" in str(exc):
                raise APIError(503, str(exc), headers={"Retry-After": "5"}) from exc
            raise APIError(500, f"model '{self.name}' cannot be loaded: {exc}", dead_letter=True) from exc
        except Exception as exc:
            err = from_engine(exc)
            if err.status == 404:
                raise err from exc
            raise APIError(
                500, f"model '{self.name}' failed to load: {err.message}", dead_letter=True
            ) from exc
        self.load_seconds = loop.time() - started
        return self.seat

    async def __aexit__(self, *exc: object) -> None:
        if not self.handed_over:
            await self.release()

    def hand_over(self) -> None:
        """A streaming response outlives the handler: leaving the ``async with`` no longer releases;
        the response calls ``release_soon`` when it ends."""
        self.handed_over = True

    async def release(self) -> None:
        """Release the model (idempotent); waits for the unload when keep_alive is 0."""
        if self.seat is None:
            return
        self.seat = None
        if self.keep_alive == 0:
            await asyncio.shield(asyncio.to_thread(self.host.release, self.name, self.keep_alive))
        else:
            self.host.release(self.name, self.keep_alive)

    def release_soon(self) -> None:
        """Release without waiting for an unload (from a stream's cleanup, maybe cancelled)."""
        if self.seat is None:
            return
        self.seat = None
        if self.keep_alive == 0:
            asyncio.get_running_loop().run_in_executor(None, self.host.release, self.name, self.keep_alive)
        else:
            self.host.release(self.name, self.keep_alive)


class Generation:
    """The jobs of one HTTP request on one model, consumed as deltas (job index = choice index)."""

    def __init__(
        self,
        seat: SeatModel,
        jobs: list[Job],
        request_id: str,
        metrics: SeatMetrics | None,
        arrival: float,
        tenant: str | None = None,
    ) -> None:
        self.seat, self.jobs, self.request_id = seat, jobs, request_id
        self.metrics, self.arrival, self.tenant = metrics, arrival, tenant
        self.streams = [ChoiceStream(i, job.params.stop) for i, job in enumerate(jobs)]
        self._queue: asyncio.Queue = asyncio.Queue()
        self._ids: list[str] = []
        self._open: set[int] = set()

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        for index, job in enumerate(self.jobs):
            sink = AsyncSink(loop, self._queue, index)
            rid = f"{self.request_id}-{index}"
            try:
                self.seat.loop.submit(job.prompt_ids, job.params, sink, rid, self.tenant)
            except RuntimeError as exc:  # the loop is stopping (the seat is shutting down)
                self.abort()
                raise APIError(503, str(exc), headers={"Retry-After": "5"}) from exc
            self._ids.append(rid)
            self._open.add(index)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Deltas until every job has finished; aborts the unfinished jobs if the consumer stops early."""
        self._start()
        try:
            while self._open:
                batch = [await self._queue.get()]
                while not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                latest: dict[int, RequestOutput] = {}
                for index, item in batch:
                    if isinstance(item, BaseException):
                        self._open.discard(index)
                        raise from_engine(item) if not isinstance(item, APIError) else item
                    if index in self._open:
                        latest[index] = item
                for index, out in sorted(latest.items()):
                    if out.finished:
                        self._open.discard(index)
                        if self.metrics is not None:
                            self.metrics.observe_request(self.seat.name, out, self.arrival)
                    yield self.streams[index].advance(out)
        finally:
            self.abort()

    async def finals(self) -> list[RequestOutput]:
        """Every job's final output, in job order."""
        async for _ in self.deltas():
            pass
        return [s.final for s in self.streams]  # type: ignore[misc]

    def abort(self) -> None:
        """Abort every job that has not finished (idempotent; thread-safe through the loop's inbox)."""
        for index in list(self._open):
            self.seat.loop.abort(self._ids[index])
        self._open.clear()
