"""OpenAI's Responses API, /v1/responses: stateless (nothing is stored), typed SSE events when ``stream``,
else the response object.

A request's path, top to bottom: ``responses`` reads it (request_context: 400s), translates it into a
chat completion (schemas_responses: ``as_chat``), leases its model, turns it into engine work as a chat
turn (openai_chat.chat_work; its 400s name the Responses API's fields), submits the work and reads it
back (generation), and formats the answer here: the ``response`` object, or its stream of typed events.

A response's ``output`` is a list of items: an assistant ``message`` with ``output_text`` for the
answer's text, and a ``function_call`` item per tool call read out of it. A reply cut by
``max_output_tokens`` is ``incomplete``. The stream sends, each with a ``sequence_number``:
``response.created`` and ``response.in_progress``; for text, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` per piece, then
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``; for
a call (once it is whole), ``response.output_item.added``, ``response.function_call_arguments.delta``,
``response.function_call_arguments.done``, ``response.output_item.done``; and last
``response.completed`` with the whole response, whose ``status`` says ``incomplete`` when it was cut
(as vLLM sends it: the openai client's stream helper waits for ``response.completed`` alone).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.outputs import RequestOutput
from engine.structured.tools import ToolCall
from nxctl.server.answer_reader import AnswerShape
from nxctl.server.api_errors import APIError, as_api_error
from nxctl.server.generation import collect, stream
from nxctl.server.lease import LeasedStream
from nxctl.server.openai_chat import chat_work
from nxctl.server.openai_shared import SSE
from nxctl.server.request_context import read_request
from nxctl.server.schemas_responses import ResponsesRequest, in_responses_terms
from nxctl.server.streaming import Delta
from nxctl.server.wire_json import compact_json

log = logging.getLogger("nxctl.serve")
router = APIRouter()


@router.post("/v1/responses")
async def responses(request: Request) -> Response:
    """One response: typed SSE events when ``stream``, else the response object."""
    ctx = await read_request(request, ResponsesRequest, "resp")
    req = ctx.body
    chat = req.as_chat()  # checked before the model is leased
    lease = ctx.seat.lease(req.model, timeline=ctx.timeline)
    async with lease as model:
        try:
            work = await chat_work(chat, model, ctx.seat.settings.default_max_tokens)
        except APIError as err:
            raise in_responses_terms(err) from err
        reply = ResponseReply(
            ctx.request_id, req.model, int(time.time()), work.prompt_tokens, _echo(req), work.shape
        )
        if req.stream:
            return LeasedStream(response_events(stream(ctx, model, work, req.user), reply), lease, SSE)
        (out,) = await collect(ctx, model, work, req.user)
        return JSONResponse(response_body(reply, out), headers={"X-Request-Id": ctx.request_id})


def _echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or ("auto" if req.tools else "none"),
        "tools": req.tools or [],
        "truncation": "disabled",
        "user": req.user,
    }


# ---- the answer as the response --------------------------------------------------------------------
@dataclass(frozen=True)
class ResponseReply:
    """What the response object repeats of the request, and its id and time."""

    request_id: str
    model: str
    created_at: int
    prompt_tokens: int
    echo: dict[str, Any]  # instructions, tools, tool_choice, temperature, top_p, text, ...
    shape: AnswerShape = AnswerShape()  # thinking and tool calls to read out of the answer


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status == "completed"
        else [],
    }


def call_item(call: ToolCall, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
    }


def response_object(
    reply: ResponseReply, output: list[dict[str, Any]], status: str, out: RequestOutput | None
) -> dict[str, Any]:
    """The ``response`` object: its output items, status and usage (none while in progress)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    completion = len(out.token_ids) if out is not None else 0
    return {
        "id": reply.request_id,
        "object": "response",
        "created_at": reply.created_at,
        "status": status,
        "model": reply.model,
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
        "previous_response_id": None,
        "store": False,
        "usage": None
        if out is None
        else {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": out.num_cached_tokens},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + completion,
        },
        **reply.echo,
    }


def _status(out: RequestOutput) -> str:
    return "incomplete" if out.finish_reason == "length" else "completed"


def reasoning_item(text: str) -> dict[str, Any]:
    """A reasoning model's thinking, as a ``reasoning`` output item."""
    return {
        "id": _id("rs"),
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def response_body(reply: ResponseReply, out: RequestOutput) -> dict[str, Any]:
    """The whole response of a request that does not stream."""
    answer = reply.shape.read(out.text)
    output = [reasoning_item(answer.reasoning)] if answer.reasoning is not None else []
    if answer.content or not answer.calls:
        output.append(message_item(_id("msg"), answer.content, "completed"))
    output += [call_item(call, _id("fc")) for call in answer.calls]
    return response_object(reply, output, _status(out), out)


@dataclass
class _EventWriter:
    """Numbers the events and keeps the output items made so far (mutated as the stream goes)."""

    reply: ResponseReply
    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    text_item: str | None = None  # the id of the open message item, while text streams into it
    text: str = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {compact_json(data)}\n\n".encode()

    def text_delta(self, piece: str) -> list[bytes]:
        events = []
        if self.text_item is None:
            self.text_item, self.text = _id("msg"), ""
            events.append(self._added(message_item(self.text_item, "", "in_progress")))
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._part("response.content_part.added", part))
        self.text += piece
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=self.text_item,
                output_index=len(self.output),
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        )
        return events

    def close_text(self) -> list[bytes]:
        if self.text_item is None:
            return []
        item = message_item(self.text_item, self.text, "completed")
        events = [
            self.event(
                "response.output_text.done",
                item_id=self.text_item,
                output_index=len(self.output),
                content_index=0,
                text=self.text,
                logprobs=[],
            ),
            self._part("response.content_part.done", item["content"][0]),
            self.event("response.output_item.done", output_index=len(self.output), item=item),
        ]
        self.output.append(item)
        self.text_item = None
        return events

    def call(self, call: ToolCall) -> list[bytes]:
        events = self.close_text()
        item_id, index = _id("fc"), len(self.output)
        events.append(self._added(call_item(call, item_id, "in_progress")))
        events.append(
            self.event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            )
        )
        events.append(
            self.event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                name=call.name,
                arguments=call.arguments,
            )
        )
        item = call_item(call, item_id)
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        return events

    def _added(self, item: dict[str, Any]) -> bytes:
        return self.event("response.output_item.added", output_index=len(self.output), item=item)

    def _part(self, kind: str, part: dict[str, Any]) -> bytes:
        return self.event(
            kind, item_id=self.text_item, output_index=len(self.output), content_index=0, part=part
        )


async def response_events(deltas: AsyncGenerator[Delta, None], reply: ResponseReply) -> AsyncIterator[bytes]:
    """The event stream of one response (an ``error`` event if the stream fails)."""
    w = _EventWriter(reply)
    reader = None if reply.shape.plain else reply.shape.reader()
    thought = ""
    yield w.event("response.created", response=response_object(reply, [], "in_progress", None))
    yield w.event("response.in_progress", response=response_object(reply, [], "in_progress", None))
    try:
        async with aclosing(deltas) as stream:
            async for d in stream:
                text, calls = d.text, list[ToolCall]()
                if reader is not None:  # thinking goes into the final response's reasoning item
                    answer = reader.feed(d.text, bool(d.finish_reason))
                    text, calls, thought = answer.content, answer.calls, thought + (answer.reasoning or "")
                for event in w.text_delta(text) if text else []:
                    yield event
                for call in calls:
                    for event in w.call(call):
                        yield event
                if d.finish_reason:
                    if not w.output and w.text_item is None:  # an empty answer is still one message
                        for event in w.text_delta(""):
                            yield event
                    for event in w.close_text():
                        yield event
                    status = _status(d.output)
                    thinking = [reasoning_item(thought.strip())] if reply.shape.reasoning and thought else []
                    final = response_object(reply, thinking + w.output, status, d.output)
                    yield w.event("response.completed", response=final)
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        if not isinstance(exc, APIError):
            log.error("formatting a stream failed", exc_info=exc)
        err = as_api_error(exc)
        yield w.event("error", code=str(err.status), message=err.message, param=None)
