"""Ollama's /api/generate: a completion of a prompt, as NDJSON lines unless ``stream`` is false; with
neither prompt nor context, a load (or, with keep_alive 0, an unload) of the model, as Ollama does.

A request's path, top to bottom: ``generate`` reads it (request_context: 400s), leases its model with
the request's keep_alive, turns it into engine work here (``generate_work``: ``context`` then the
prompt, raw or through the chat template with ``system``, the oldest tokens cut to fit the context,
the grammar of ``format`` from structured_fields, SamplingParams from ollama_sampling), submits the
work and reads it back (generation), and shapes the answer's response here (ollama_shared frames it),
the last body with the ``context`` to continue from.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from engine.structured.tools import ToolCall
from nxctl.server.generation import Work
from nxctl.server.host import SeatModel
from nxctl.server.ollama_sampling import OllamaLimits, ollama_top
from nxctl.server.ollama_shared import OllamaReply, load_or_unload, ollama_body, respond
from nxctl.server.request_context import read_request
from nxctl.server.schemas_ollama import GenerateRequest
from nxctl.server.streaming import Delta
from nxctl.server.structured_fields import Constraints, constrain
from nxctl.server.tokens import check_ids

router = APIRouter()
EMPTY = {"response": ""}


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    """A completion of a prompt (or, with neither prompt nor context, a load / unload)."""
    ctx = await read_request(request, GenerateRequest, "ollama")
    req = ctx.body
    if not req.prompt and not req.context:
        return await load_or_unload(ctx, req.keep(), EMPTY)
    lease = ctx.seat.lease(req.model, req.keep(), ctx.timeline)
    async with lease as model:
        work = await generate_work(req, model, ctx.seat.settings.default_max_tokens)
        return await respond(ctx, req, lease, model, work, generate_body)


# ---- the request as engine work --------------------------------------------------------------------
async def generate_work(req: GenerateRequest, model: SeatModel, default_max: int) -> Work:
    """``context`` then the prompt (raw, or through the chat template with ``system``), the oldest
    tokens cut to fit the context."""
    limits = OllamaLimits.of(req.options, model, default_max)
    tok = model.tokenizer
    if req.raw or not tok.chat_template:  # BOS begins the sequence: not after an earlier context
        ids = tok.encode(req.prompt or "") if req.context else tok.encode_prompt(req.prompt or "")
    else:
        turns = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": req.prompt or ""}
        ]
        ids = await asyncio.to_thread(tok.encode_chat, turns, True, None, req.think)
    ids = list(req.context or []) + ids
    check_ids(ids, model.llm.model_config.vocab_size)
    asked = Constraints(format=req.format, thinking=req.think is not False and not req.raw)
    grammar, shape = await constrain(asked, model, ids)
    top = ollama_top(req.logprobs, req.top_logprobs)
    work = limits.work(ids[-limits.prompt :], req.options, top, grammar)
    return dataclasses.replace(work, shape=shape)


# ---- the answer as the response --------------------------------------------------------------------
def generate_body(
    reply: OllamaReply,
    d: Delta,
    final: dict[str, Any] | None,
    calls: list[ToolCall] | None = None,
    thinking: str | None = None,
) -> dict[str, Any]:
    """One body: ``d``'s text as the response, a reasoning model's ``thinking`` beside it; the last one
    carries the ``context`` to continue from (the prompt's tokens and the answer's). No tools here:
    ``calls`` is always empty."""
    head: dict[str, Any] = {"response": d.text, **({"thinking": thinking} if thinking else {})}
    tail = (
        {"context": list(d.output.prompt_token_ids) + list(d.output.token_ids)} if final is not None else {}
    )
    return ollama_body(reply, d, final, head, tail)
