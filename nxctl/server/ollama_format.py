"""Stage 5 for the Ollama API: /api/chat and /api/generate bodies, as one answer or NDJSON lines."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

from engine.loader import ChatTokenizer
from engine.outputs import RequestOutput
from engine.structured.tools import ToolCall
from nxctl.server.answer_reader import AnswerShape
from nxctl.server.api_errors import APIError, as_api_error
from nxctl.server.finish_reasons import api_finish
from nxctl.server.model_info import iso_time
from nxctl.server.streaming import Delta
from nxctl.server.tokens import token_text

log = logging.getLogger("nxctl.serve")
NS = 1_000_000_000
Endpoint = Literal["chat", "generate"]


@dataclass(frozen=True)
class OllamaReply:
    """What every body and line of one /api/chat or /api/generate answer shares."""

    model: str  # the model as the request named it
    endpoint: Endpoint
    tokenizer: ChatTokenizer
    logprobs: bool
    arrival: float  # perf_counter seconds
    load_seconds: float
    shape: AnswerShape = AnswerShape()  # its thinking and tool calls, read back out of its text


def now_iso() -> str:
    """The ``created_at`` of a body: now, in Ollama's time format."""
    return iso_time(time.time())


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


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


def tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Ollama's ``message.tool_calls``: each call's function name and arguments (an object)."""
    return [{"function": {"name": c.name, "arguments": c.arguments_object}} for c in calls]


def body(
    reply: OllamaReply,
    d: Delta,
    final: dict[str, Any] | None,
    calls: list[ToolCall] | None = None,
    thinking: str | None = None,
) -> dict[str, Any]:
    """One body (a line, or the whole answer): ``d``'s text as the message (chat, with the tool
    ``calls`` it made) or the response (generate), a reasoning model's ``thinking`` beside it; the
    final one adds ``final`` and, for generate, the ``context`` to continue from."""
    out: dict[str, Any] = {"model": reply.model, "created_at": now_iso()}
    if reply.endpoint == "chat":
        out["message"] = {"role": "assistant", "content": d.text}
        if thinking:
            out["message"]["thinking"] = thinking
        if calls:
            out["message"]["tool_calls"] = tool_calls(calls)
    else:
        out["response"] = d.text
        if thinking:
            out["thinking"] = thinking
    if reply.logprobs:
        out["logprobs"] = logprobs(reply.tokenizer, d)
    if final is not None and reply.endpoint == "generate":
        out["context"] = list(d.output.prompt_token_ids) + list(d.output.token_ids)
    return {**out, "done": final is not None, **(final or {})}


def answer(reply: OllamaReply, out: RequestOutput) -> dict[str, Any]:
    """The single body of a request that does not stream."""
    answer = reply.shape.read(out.text)
    whole = Delta(0, answer.content, out.token_ids, out.logprobs, out.top_logprobs, out.finish_reason, out)
    final = final_fields(out, reply.arrival, reply.load_seconds)
    return body(reply, whole, final, answer.calls, answer.reasoning)


async def ndjson(deltas: AsyncGenerator[Delta, None], reply: OllamaReply) -> AsyncIterator[bytes]:
    """The NDJSON stream: a line per delta with news, a last line with the counts and durations, or an
    ``{"error": ...}`` line if the stream fails."""
    reader = None if reply.shape.plain else reply.shape.reader()
    try:
        async with aclosing(deltas) as stream:
            async for d in stream:
                calls: list[ToolCall] = []
                thinking = None
                if reader is not None:
                    answer = reader.feed(d.text, bool(d.finish_reason))
                    calls, thinking = answer.calls, answer.reasoning
                    d = dataclasses.replace(d, text=answer.content)
                if d.text or calls or thinking or (reply.logprobs and d.token_ids):
                    yield line(body(reply, d, None, calls, thinking))
                if d.finish_reason:
                    empty = Delta(d.index, "", [], [], [], d.finish_reason, d.output)
                    yield line(body(reply, empty, final_fields(d.output, reply.arrival, reply.load_seconds)))
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error line
        if not isinstance(exc, APIError):
            log.error("formatting a stream failed", exc_info=exc)
        yield line({"error": as_api_error(exc).message})


def loaded(model: str, endpoint: Endpoint, reason: Literal["load", "unload"]) -> dict[str, Any]:
    """The answer to an empty request, which only loads or unloads the model."""
    empty = {"message": {"role": "assistant", "content": ""}} if endpoint == "chat" else {"response": ""}
    return {"model": model, "created_at": now_iso(), **empty, "done": True, "done_reason": reason}
