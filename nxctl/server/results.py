"""Stage 4 of a request: its engine outputs streamed as deltas, or collected as final outputs.

Either way a job that ends in ``error`` or ``abort`` is a server-side failure (an APIError kept as a
dead letter), a client that leaves stops the work (its jobs aborted), and the request's log line gets
its completion tokens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.types import Receive

from engine.errors import NxError
from engine.outputs import RequestOutput
from nxctl.server.api_errors import APIError, as_api_error
from nxctl.server.finish_reasons import failed
from nxctl.server.seat import dead_letter, note
from nxctl.server.streaming import ChoiceStream, Delta
from nxctl.server.submit import Generation

log = logging.getLogger("nxctl.serve")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def failure(out: RequestOutput) -> APIError:
    """A job that ended in ``error`` or ``abort``: a server-side failure (kept as a dead letter)."""
    if out.finish_reason == "abort":
        return APIError(503, "the request was aborted: the seat is shutting down", dead_letter=True)
    return APIError(500, f"engine error: {out.error or 'unknown'}", dead_letter=True)


async def stream(request: Request, gen: Generation) -> AsyncGenerator[Delta, None]:
    """The jobs' deltas as they come (text held back while it may still become a stop string).

    Raises only APIError, already recorded (dead letter, log line): the formatter turns it into the
    stream's error event. Closing this iterator aborts the unfinished jobs."""
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


async def collect(request: Request, gen: Generation) -> list[RequestOutput]:
    """Every job's final output, in job order (unless the client leaves first: ClientGone); a failed
    job raises its APIError (the app's handler keeps it as a dead letter)."""
    outs = await until_disconnect(request, _finals(gen))
    for out in outs:
        if failed(out.finish_reason):
            raise failure(out)
    note(request, completion_tokens=sum(len(o.token_ids) for o in outs))
    return outs


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
