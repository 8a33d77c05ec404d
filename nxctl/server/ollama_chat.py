"""Ollama's /api/chat: one chat turn, as NDJSON lines unless ``stream`` is false; with no messages, a load
(or, with keep_alive 0, an unload) of the model, as Ollama does.

A request's path, top to bottom: ``chat`` reads it (request_context: 400s), leases its model with the
request's keep_alive, turns it into engine work here (``chat_work``: the messages and tools through the
chat template, the oldest turns cut to fit the context (system messages kept), the grammar of
``format`` and the tools from structured_fields, SamplingParams from ollama_sampling), submits the work
and reads it back (generation), and shapes the answer's message here (ollama_shared frames it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidRequestError
from engine.structured.tools import ToolCall
from nxctl.server.api_errors import bad_request
from nxctl.server.generation import Work
from nxctl.server.host import SeatModel
from nxctl.server.ollama_sampling import OllamaLimits, ollama_top
from nxctl.server.ollama_shared import OllamaReply, load_or_unload, ollama_body, respond
from nxctl.server.request_context import read_request
from nxctl.server.schemas_ollama import ChatRequest, Message
from nxctl.server.streaming import Delta
from nxctl.server.structured_fields import Constraints, constrain
from nxctl.server.tokens import fit_messages
from nxctl.server.tool_fields import tools_of

router = APIRouter()
EMPTY = {"message": {"role": "assistant", "content": ""}}


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    """A chat turn (or, with no messages, a load / unload)."""
    ctx = await read_request(request, ChatRequest, "ollama")
    req = ctx.body
    if not req.messages:
        return await load_or_unload(ctx, req.keep(), EMPTY)
    lease = ctx.seat.lease(req.model, req.keep(), ctx.timeline)
    async with lease as model:
        work = await chat_work(req, model, ctx.seat.settings.default_max_tokens)
        return await respond(ctx, req, lease, model, work, chat_body)


# ---- the request as engine work --------------------------------------------------------------------
async def chat_work(req: ChatRequest, model: SeatModel, default_max: int) -> Work:
    """The messages through the chat template, the oldest turns cut to fit the context; the model
    chooses whether to call the tools (as with OpenAI's "auto")."""
    limits = OllamaLimits.of(req.options, model, default_max)
    messages = [template_message(m) for m in req.messages or []]
    tools = tools_of(req.tools)
    tok = model.tokenizer
    try:
        ids, _ = await asyncio.to_thread(fit_messages, tok, messages, limits.prompt, tools, req.think)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), param="messages") from exc
    asked = Constraints(format=req.format, tools=tools, tool_choice="auto", thinking=req.think is not False)
    grammar, shape = await constrain(asked, model, ids)
    work = limits.work(ids, req.options, ollama_top(req.logprobs, req.top_logprobs), grammar)
    return dataclasses.replace(work, shape=shape)


def template_message(message: Message) -> dict[str, Any]:
    """A message as chat templates take it (OpenAI's shape: calls' arguments as JSON text)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {
                    "name": str((c.get("function") or {}).get("name", "")),
                    "arguments": json.dumps((c.get("function") or {}).get("arguments") or {}),
                },
            }
            for n, c in enumerate(message.tool_calls)
        ]
    if message.tool_name:
        out["name"] = message.tool_name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


# ---- the answer as the response --------------------------------------------------------------------
def chat_body(
    reply: OllamaReply,
    d: Delta,
    final: dict[str, Any] | None,
    calls: list[ToolCall] | None = None,
    thinking: str | None = None,
) -> dict[str, Any]:
    """One body: ``d``'s text as the assistant's message, with a reasoning model's ``thinking`` and the
    tool ``calls`` it made (each function's name and arguments, an object)."""
    message: dict[str, Any] = {"role": "assistant", "content": d.text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c.name, "arguments": c.arguments_object}} for c in calls
        ]
    return ollama_body(reply, d, final, {"message": message})
