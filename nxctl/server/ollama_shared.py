"""What Ollama's /api/chat and /api/generate share: the reply every line repeats, NDJSON lines, logprobs,
the counts and durations of the last line, the answer as one body or as lines (each endpoint shapes
its own body), and the empty request that only loads or unloads a model."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from starlette.responses import JSONResponse, Response

from engine.loader import ChatTokenizer
from engine.outputs import RequestOutput
from engine.structured.tools import ToolCall
from nxctl.server.answer_reader import AnswerShape
from nxctl.server.api_errors import APIError, as_api_error
from nxctl.server.finish_reasons import api_finish
from nxctl.server.generation import Work, collect, stream
from nxctl.server.host import SeatModel
from nxctl.server.keep_alive import KeepAlive
from nxctl.server.lease import LeasedStream, ModelLease
from nxctl.server.model_info import iso_time
from nxctl.server.request_context import RequestContext
from nxctl.server.streaming import Delta
from nxctl.server.tokens import token_text
from nxctl.server.wire_json import compact_json

log = logging.getLogger("nxctl.serve")
NS = 1_000_000_000
NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class OllamaReply:
    """What every body and line of one /api/chat or /api/generate answer shares."""

    model: str  # the model as the request named it
    tokenizer: ChatTokenizer
    logprobs: bool
    arrival: float  # perf_counter seconds
    load_seconds: float
    shape: AnswerShape = AnswerShape()  # its thinking and tool calls, read back out of its text


class Body(Protocol):
    """An endpoint's body (ollama_chat.chat_body, ollama_generate.generate_body): ``d`` as its message
    or response, with the tool ``calls`` and ``thinking`` read out of it; ``final`` on the last one."""

    def __call__(
        self,
        reply: OllamaReply,
        d: Delta,
        final: dict[str, Any] | None,
        calls: list[ToolCall] | None = None,
        thinking: str | None = None,
    ) -> dict[str, Any]: ...


def now_iso() -> str:
    """The ``created_at`` of a body: now, in Ollama's time format."""
    return iso_time(time.time())


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return (compact_json(obj) + "\n").encode()


def logprobs(tok: ChatTokenizer, d: Delta) -> list[dict[str, Any]]:
    """Ollama's ``logprobs``: per token its text, logprob and the requested alternatives."""
    out = []
    for n, (token_id, lp) in enumerate(zip(d.token_ids, d.logprobs, strict=False)):
        tops = d.top_logprobs[n] if n < len(d.top_logprobs) else []
        alts = [{"token": token_text(tok, t), "logprob": v} for t, v in tops]
        out.append({"token": token_text(tok, token_id), "logprob": lp, "top_logprobs": alts})
    return out


def final_fields(out: RequestOutput, arrival: float, load_s: float) -> dict[str, Any]:
    """The counts and durations (nanoseconds) of Ollama's last chunk."""
    first = out.first_token_time or out.finish_time or arrival
    finish = out.finish_time or time.perf_counter()
    return {
        "done_reason": api_finish(out.finish_reason) if out.finish_reason else "stop",
        "total_duration": int(max(finish - arrival, 0) * NS),
        "load_duration": int(load_s * NS),
        "prompt_eval_count": len(out.prompt_token_ids),
        "prompt_eval_duration": int(max(first - out.arrival_time, 0) * NS),
        "eval_count": len(out.token_ids),
        "eval_duration": int(max(finish - first, 0) * NS),
    }


def ollama_body(
    reply: OllamaReply,
    d: Delta,
    final: dict[str, Any] | None,
    head: dict[str, Any],
    tail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One body (a line, or the whole answer): the endpoint's ``head`` (its message or response), the
    logprobs of ``d`` when asked, the endpoint's ``tail``; the last one adds ``final``."""
    out: dict[str, Any] = {"model": reply.model, "created_at": now_iso(), **head}
    if reply.logprobs:
        out["logprobs"] = logprobs(reply.tokenizer, d)
    return {**out, **(tail or {}), "done": final is not None, **(final or {})}


def answer(reply: OllamaReply, out: RequestOutput, body: Body) -> dict[str, Any]:
    """The single body of a request that does not stream."""
    read = reply.shape.read(out.text)
    whole = Delta(0, read.content, out.token_ids, out.logprobs, out.top_logprobs, out.finish_reason, out)
    final = final_fields(out, reply.arrival, reply.load_seconds)
    return body(reply, whole, final, read.calls, read.reasoning)


async def ndjson(deltas: AsyncGenerator[Delta, None], reply: OllamaReply, body: Body) -> AsyncIterator[bytes]:
    """The NDJSON stream: a line per delta with news, a last line with the counts and durations, or an
    ``{"error": ...}`` line if the stream fails."""
    reader = None if reply.shape.plain else reply.shape.reader()
    try:
        async with aclosing(deltas) as deltas_read:
            async for d in deltas_read:
                calls: list[ToolCall] = []
                thinking = None
                if reader is not None:
                    read = reader.feed(d.text, bool(d.finish_reason))
                    calls, thinking = read.calls, read.reasoning
                    d = dataclasses.replace(d, text=read.content)
                if d.text or calls or thinking or (reply.logprobs and d.token_ids):
                    yield line(body(reply, d, None, calls, thinking))
                if d.finish_reason:
                    empty = Delta(d.index, "", [], [], [], d.finish_reason, d.output)
                    final = final_fields(d.output, reply.arrival, reply.load_seconds)
                    yield line(body(reply, empty, final, None, None))
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error line
        if not isinstance(exc, APIError):
            log.error("formatting a stream failed", exc_info=exc)
        yield line({"error": as_api_error(exc).message})


class Asked(Protocol):
    """What an Ollama generation request says of its answer (ChatRequest, GenerateRequest)."""

    model: str
    logprobs: bool | None
    stream: bool | None


async def respond(
    ctx: RequestContext[Any], req: Asked, lease: ModelLease, model: SeatModel, work: Work, body: Body
) -> Response:
    """The leased ``model``'s answer to ``work`` as ``body`` shapes it: NDJSON lines unless the request
    turned streaming off, else one JSON object."""
    reply = OllamaReply(
        req.model, model.tokenizer, bool(req.logprobs), ctx.arrival, lease.load_seconds, work.shape
    )
    if req.stream is not False:
        return LeasedStream(ndjson(stream(ctx, model, work), reply, body), lease, NDJSON)
    (out,) = await collect(ctx, model, work)
    return JSONResponse(answer(reply, out, body))


async def load_or_unload(ctx: RequestContext[Any], keep: KeepAlive, empty: dict[str, Any]) -> Response:
    """Ollama's empty request: load the model (done_reason "load"), or unload it with keep_alive 0;
    ``empty``: the endpoint's empty message or response."""
    name = ctx.body.model
    if keep.unloads_now:
        ctx.seat.host.spec(name)
        await asyncio.to_thread(ctx.seat.host.unload, name)
        reason: Literal["load", "unload"] = "unload"
    else:
        async with ctx.seat.lease(name, keep, ctx.timeline):
            reason = "load"
    body = {"model": name, "created_at": now_iso(), **empty, "done": True, "done_reason": reason}
    return JSONResponse(body)
