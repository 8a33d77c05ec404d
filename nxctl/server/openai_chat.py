"""OpenAI's /v1/chat/completions: one chat completion, as SSE chunks when ``stream``, else one body.

A request's path, top to bottom: ``chat_completions`` reads it (request_context: 400s), leases its model
(404, 503), turns it into engine work here (``chat_work``: the messages and tools through the chat
template, the answer's grammar from structured_fields, SamplingParams per choice from openai_sampling),
submits the work and reads it back (generation: 503 when the queue is full), and formats the answers
here: a reasoning model's thinking as ``reasoning_content``, tool calls read out of the text, logprobs
per token. The Responses API (openai_responses.py) runs its requests through ``chat_work`` too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.errors import InvalidRequestError
from engine.loader import ChatTokenizer
from engine.outputs import RequestOutput
from engine.structured.tools import ToolCall
from nxctl.server.answer_reader import AnswerReader, AnswerShape
from nxctl.server.api_errors import bad_request
from nxctl.server.finish_reasons import api_finish, api_finish_or_none
from nxctl.server.generation import Job, Work, collect, stream
from nxctl.server.host import SeatModel
from nxctl.server.lease import LeasedStream
from nxctl.server.openai_sampling import openai_params
from nxctl.server.openai_shared import FINGERPRINT, SSE, Reply, error_event, sse, usage, with_usage
from nxctl.server.request_context import read_request
from nxctl.server.schemas_openai import ChatCompletionRequest, ChatMessage
from nxctl.server.streaming import Delta
from nxctl.server.structured_fields import Constraints, constrain
from nxctl.server.tokens import chat_prompt_ids, token_bytes, token_text
from nxctl.server.tool_fields import requested_tools

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """A chat completion: SSE chunks when ``stream``, else one body."""
    ctx = await read_request(request, ChatCompletionRequest, "chatcmpl")
    req = ctx.body
    lease = ctx.seat.lease(req.model, timeline=ctx.timeline)
    async with lease as model:
        work = await chat_work(req, model, ctx.seat.settings.default_max_tokens)
        reply = Reply(ctx.request_id, req.model, int(time.time()), model.tokenizer, work.prompt_tokens)
        want_lp = bool(req.logprobs)
        if req.stream:
            deltas = stream(ctx, model, work, req.user)
            events = chat_events(deltas, reply, len(work.jobs), want_lp, with_usage(req), work.shape)
            return LeasedStream(events, lease, SSE)
        outs = await collect(ctx, model, work, req.user)
        body = chat_response(reply, outs, want_lp, work.shape)
        return JSONResponse(body, headers={"X-Request-Id": ctx.request_id})


# ---- the request as engine work --------------------------------------------------------------------
async def chat_work(req: ChatCompletionRequest, model: SeatModel, default_max: int) -> Work:
    """The messages (and tools) through the chat template, ``n`` jobs on that prompt; with tools, the
    grammar of ``tool_choice``; with a response format, its grammar (after a reasoning model's thinking)."""
    messages = [template_message(m) for m in req.messages]
    tools, choice = requested_tools([t.model_dump() for t in req.tools or []], req.tool_choice)
    thinking = thinking_option(req.chat_template_kwargs)
    try:
        ids = await asyncio.to_thread(chat_prompt_ids, model.tokenizer, messages, tools, thinking)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), param="messages") from exc
    asked = Constraints(
        response_format=req.response_format,
        structured_outputs=req.structured_outputs,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        thinking=thinking is not False,
    )
    grammar, shape = await constrain(asked, model, ids)
    top = (req.top_logprobs or 0) if req.logprobs else None
    vocab = model.llm.model_config.vocab_size
    params = openai_params(req, len(ids), model.context_tokens, default_max, top, grammar, vocab)
    return Work([Job(ids, p) for p in params], len(ids), shape)


def template_message(message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates take it (developer is system; calls and call ids kept)."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
    out["content"] = None if message.content is None and message.tool_calls else message.text()
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


def thinking_option(kwargs: dict[str, Any] | None) -> bool | None:
    """``chat_template_kwargs`` (as vLLM takes it): only ``enable_thinking``, a boolean."""
    if not kwargs:
        return None
    if set(kwargs) != {"enable_thinking"} or not isinstance(kwargs["enable_thinking"], bool):
        raise bad_request(
            "chat_template_kwargs takes enable_thinking (true or false) alone", param="chat_template_kwargs"
        )
    return kwargs["enable_thinking"]


# ---- the answers as the response -------------------------------------------------------------------
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


def chat_chunk(reply: Reply, choices: list[dict[str, Any]], with_usage_field: bool) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (``usage: null`` on each when usage comes last)."""
    chunk = {
        "id": reply.request_id,
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
    }
    if with_usage_field:
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
    with_usage_chunk: bool,
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
            yield sse(chat_chunk(reply, [first], with_usage_chunk))
        completion = 0
        async with aclosing(deltas) as deltas_read:
            async for delta in deltas_read:
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
                    yield sse(chat_chunk(reply, [choice], with_usage_chunk))
        if with_usage_chunk:
            yield sse({**chat_chunk(reply, [], False), "usage": usage(reply.prompt_tokens, completion)})
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        yield error_event(exc)
    yield sse("[DONE]")
