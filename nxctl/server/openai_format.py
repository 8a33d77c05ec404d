"""Stage 5 for the OpenAI API: response bodies, and SSE chunks from a stream of deltas."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from engine.loader import ChatTokenizer
from engine.outputs import RequestOutput
from engine.structured.tools import ToolCall
from nxctl import __version__
from nxctl.server.answer_reader import AnswerReader, AnswerShape
from nxctl.server.api_errors import APIError, as_api_error
from nxctl.server.finish_reasons import api_finish, api_finish_or_none
from nxctl.server.streaming import Delta
from nxctl.server.tokens import token_bytes, token_text

log = logging.getLogger("nxctl.serve")
FINGERPRINT = f"nxctl-{__version__}"


@dataclass(frozen=True)
class Reply:
    """What every body and chunk of one OpenAI response shares."""

    request_id: str
    model: str  # the model as the request named it
    created: int  # Unix seconds
    tokenizer: ChatTokenizer
    prompt_tokens: int


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_event(err: APIError) -> bytes:
    """The event that ends a stream that failed."""
    kind = "server_error" if err.status >= 500 else "invalid_request_error"
    return sse({"error": {"message": err.message, "type": kind, "param": None, "code": err.status}})


def chat_logprobs(
    tok: ChatTokenizer, ids: Sequence[int], lps: Sequence[float], tops: Sequence[Sequence[tuple[int, float]]]
) -> dict[str, Any]:
    """Chat ``logprobs``: one entry per token, with its bytes and the requested alternatives."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        """One token's text, logprob and bytes."""
        return {
            "token": token_text(tok, token_id),
            "logprob": logprob,
            "bytes": list(token_bytes(tok, token_id)),
        }

    content = []
    for n, (token_id, lp) in enumerate(zip(ids, lps, strict=False)):
        alternatives = [entry(t, v) for t, v in tops[n]] if n < len(tops) else []
        content.append({**entry(token_id, lp), "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(
    tok: ChatTokenizer,
    ids: Sequence[int],
    lps: Sequence[float],
    tops: Sequence[Sequence[tuple[int, float]]],
    offset: int = 0,
) -> dict[str, Any]:
    """Legacy completions ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset (from ``offset``)."""
    tokens = [token_text(tok, t) for t in ids]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    top = [{token_text(tok, t): v for t, v in tops[n]} if n < len(tops) else {} for n in range(len(ids))]
    return {
        "tokens": tokens,
        "token_logprobs": list(lps[: len(ids)]),
        "top_logprobs": top,
        "text_offset": offsets,
    }


# ---- chat ----------------------------------------------------------------------------------------
def tool_call_objects(calls: Sequence[ToolCall], streamed_from: int | None = None) -> list[dict[str, Any]]:
    """OpenAI's ``tool_calls``: id, type, function name and arguments (JSON text); in a stream chunk
    each also carries its ``index`` among the choice's calls (from ``streamed_from``)."""
    objects = []
    for n, call in enumerate(calls):
        entry = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        objects.append(entry if streamed_from is None else {"index": streamed_from + n, **entry})
    return objects


def chat_message(out: RequestOutput, shape: AnswerShape) -> tuple[dict[str, Any], str]:
    """The answer's message (a reasoning model's thinking as ``reasoning_content``, tool calls read
    out of its text when tools were given) and its finish reason (``tool_calls`` when it called any)."""
    finish: str = api_finish(out.finish_reason) if out.finish_reason else "stop"
    if shape.plain:
        return {"role": "assistant", "content": out.text}, finish
    answer = shape.read(out.text)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.content or (None if answer.calls else ""),
    }
    if answer.reasoning is not None:
        message["reasoning_content"] = answer.reasoning
    if answer.calls:
        message["tool_calls"] = tool_call_objects(answer.calls)
        finish = "tool_calls" if finish == "stop" else finish
    return message, finish


def chat_response(
    reply: Reply, outs: list[RequestOutput], want_logprobs: bool, shape: AnswerShape | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` body: one choice per final output."""
    choices = []
    for i, out in enumerate(outs):
        lp = (
            chat_logprobs(reply.tokenizer, out.token_ids, out.logprobs, out.top_logprobs)
            if want_logprobs
            else None
        )
        message, finish = chat_message(out, shape or AnswerShape())
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
    return {
        "id": reply.request_id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": usage(reply.prompt_tokens, sum(len(o.token_ids) for o in outs)),
        "system_fingerprint": FINGERPRINT,
    }


def chat_chunk(reply: Reply, choices: list[dict[str, Any]], with_usage: bool) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (``usage: null`` on each when usage comes last)."""
    chunk = {
        "id": reply.request_id,
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def chat_delta_choice(delta: Delta, tok: ChatTokenizer, want_logprobs: bool) -> dict[str, Any]:
    """A chunk's choice: the delta's text (none on the finishing chunk when it has none), its logprobs."""
    lp = None
    if want_logprobs and delta.token_ids:
        lp = chat_logprobs(tok, delta.token_ids, delta.logprobs, delta.top_logprobs)
    content = {"content": delta.text} if delta.text or not delta.finish_reason else {}
    finish = api_finish_or_none(delta.finish_reason)
    return {"index": delta.index, "delta": content, "logprobs": lp, "finish_reason": finish}


class AnswerDeltas:
    """Per choice, reads streamed text into thinking (``reasoning_content`` deltas), content and tool
    calls: text that may still become a tag is held back, a call goes out whole in one ``tool_calls``
    delta once it closes (as OpenAI's clients accumulate them), and the last chunk says
    ``tool_calls`` when the choice called any."""

    def __init__(self, shape: AnswerShape):
        self.shape = shape
        self.readers: dict[int, AnswerReader] = {}

    def rewrite(self, delta: Delta) -> tuple[Delta, dict[str, Any], str | None]:
        """The delta with only its content, what else its chunk carries, and its finish reason."""
        reader = self.readers.setdefault(delta.index, self.shape.reader())
        before = len(reader.calls)
        answer = reader.feed(delta.text, bool(delta.finish_reason))
        extra: dict[str, Any] = {}
        if answer.reasoning:
            extra["reasoning_content"] = answer.reasoning
        if answer.calls:
            extra["tool_calls"] = tool_call_objects(answer.calls, before)
        finish: str | None = api_finish_or_none(delta.finish_reason)
        if finish == "stop" and reader.calls:
            finish = "tool_calls"
        return dataclasses.replace(delta, text=answer.content), extra, finish


async def chat_events(
    deltas: AsyncGenerator[Delta, None],
    reply: Reply,
    choices: int,
    want_logprobs: bool,
    with_usage: bool,
    shape: AnswerShape | None = None,
) -> AsyncIterator[bytes]:
    """The SSE stream of a chat completion: a role chunk per choice, a chunk per delta with news, the
    usage chunk when asked, an error event if the stream fails, then ``[DONE]``."""
    reading = AnswerDeltas(shape) if shape is not None and not shape.plain else None
    try:
        for i in range(choices):
            first = {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield sse(chat_chunk(reply, [first], with_usage))
        completion = 0
        async with aclosing(deltas) as stream:
            async for delta in stream:
                if delta.finish_reason:
                    completion += len(delta.output.token_ids)
                extra: dict[str, Any] = {}
                if reading is not None:
                    delta, extra, finish = reading.rewrite(delta)
                if delta.text or delta.finish_reason or extra or (want_logprobs and delta.token_ids):
                    choice = chat_delta_choice(delta, reply.tokenizer, want_logprobs)
                    if extra:
                        choice["delta"] = {**extra, **({"content": delta.text} if delta.text else {})}
                    if reading is not None:
                        choice["finish_reason"] = finish
                    yield sse(chat_chunk(reply, [choice], with_usage))
        if with_usage:
            yield sse({**chat_chunk(reply, [], False), "usage": usage(reply.prompt_tokens, completion)})
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        yield error_event(_unexpected(exc))
    yield sse("[DONE]")


# ---- text completions ----------------------------------------------------------------------------
def completion_response(reply: Reply, outs: list[RequestOutput], logprobs: int | None) -> dict[str, Any]:
    """The ``text_completion`` body: one choice per final output."""
    choices = []
    for i, out in enumerate(outs):
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(reply.tokenizer, out.token_ids, out.logprobs, out.top_logprobs)
        finish = api_finish(out.finish_reason) if out.finish_reason else "stop"
        choices.append({"index": i, "text": out.text, "logprobs": lp, "finish_reason": finish})
    return {
        "id": reply.request_id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": usage(reply.prompt_tokens, sum(len(o.token_ids) for o in outs)),
        "system_fingerprint": FINGERPRINT,
    }


def completion_delta_choice(
    delta: Delta, tok: ChatTokenizer, logprobs: int | None, offset: int
) -> dict[str, Any]:
    """A text completion chunk's choice; ``offset``: the characters of this choice sent before."""
    lp = None
    if logprobs is not None:
        lp = completion_logprobs(tok, delta.token_ids, delta.logprobs, delta.top_logprobs, offset)
    finish = api_finish_or_none(delta.finish_reason)
    return {"index": delta.index, "text": delta.text, "logprobs": lp, "finish_reason": finish}


async def completion_events(
    deltas: AsyncGenerator[Delta, None], reply: Reply, logprobs: int | None, with_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE stream of a text completion: a chunk per step with tokens (as vLLM), the usage chunk when
    asked, an error event if the stream fails, then ``[DONE]``."""
    base = {
        "id": reply.request_id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
    }
    offsets: dict[int, int] = {}
    completion = 0
    try:
        async with aclosing(deltas) as stream:
            async for d in stream:
                completion += len(d.output.token_ids) if d.finish_reason else 0
                if d.text or d.finish_reason or d.token_ids:
                    choice = completion_delta_choice(d, reply.tokenizer, logprobs, offsets.get(d.index, 0))
                    offsets[d.index] = offsets.get(d.index, 0) + len(d.text)
                    yield sse({**base, "choices": [choice], **({"usage": None} if with_usage else {})})
        if with_usage:
            yield sse({**base, "choices": [], "usage": usage(reply.prompt_tokens, completion)})
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        yield error_event(_unexpected(exc))
    yield sse("[DONE]")


def _unexpected(exc: Exception) -> APIError:
    """The stage before raises only APIError; anything else is a bug here, logged and sent as a 500."""
    if not isinstance(exc, APIError):
        log.error("formatting a stream failed", exc_info=exc)
    return as_api_error(exc)
