"""The OpenAI API: /v1/chat/completions, /v1/completions (streaming SSE or not), /v1/models, /v1/embeddings.

A generation route passes each stage once, in order:

    request_context.read_request    the JSON body against its pydantic schema (400s), the request's id
    seat.lease                      the model, held for the request (loaded if needed; 404, 503)
    to_engine_params.*_work         prompt token ids and SamplingParams per choice (400s)
    generation.stream | collect     the jobs on the model's engine loop (503 when its queue is full),
                                    read back as deltas as they come, or as the final outputs
    openai_format.*                 the response body, or its SSE chunks
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nxctl.server import openai_format as fmt
from nxctl.server.embeddings import as_base64, embed
from nxctl.server.generation import Work, collect, stream
from nxctl.server.host import SeatModel
from nxctl.server.lease import LeasedStream
from nxctl.server.request_context import RequestContext, note, parse_body, read_request, seat_of
from nxctl.server.schemas_openai import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from nxctl.server.to_engine_params import chat_work, completion_work, embedding_ids

router = APIRouter()
SSE = "text/event-stream"


def _reply(ctx: RequestContext[Any], model: SeatModel, work: Work) -> fmt.Reply:
    """What the response's bodies or chunks share, created now."""
    return fmt.Reply(ctx.request_id, ctx.body.model, int(time.time()), model.tokenizer, work.prompt_tokens)


def _with_usage(req: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
    return bool(req.stream_options and req.stream_options.include_usage)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """A chat completion: SSE chunks when ``stream``, else one body."""
    ctx = await read_request(request, ChatCompletionRequest, "chatcmpl")
    req = ctx.body
    lease = ctx.seat.lease(req.model, timeline=ctx.timeline)
    async with lease as model:
        work = await chat_work(req, model, ctx.seat.settings.default_max_tokens)
        reply = _reply(ctx, model, work)
        want_lp = bool(req.logprobs)
        if req.stream:
            deltas = stream(ctx, model, work, req.user)
            events = fmt.chat_events(deltas, reply, len(work.jobs), want_lp, _with_usage(req), work.shape)
            return LeasedStream(events, lease, SSE)
        outs = await collect(ctx, model, work, req.user)
        body = fmt.chat_response(reply, outs, want_lp, work.shape)
        return JSONResponse(body, headers={"X-Request-Id": ctx.request_id})


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """A text completion of one or more prompts: SSE chunks when ``stream``, else one body."""
    ctx = await read_request(request, CompletionRequest, "cmpl")
    req = ctx.body
    lease = ctx.seat.lease(req.model, timeline=ctx.timeline)
    async with lease as model:
        work = await completion_work(req, model, ctx.seat.settings.default_max_tokens)
        reply = _reply(ctx, model, work)
        if req.stream:
            deltas = stream(ctx, model, work, req.user)
            events = fmt.completion_events(deltas, reply, req.logprobs, _with_usage(req))
            return LeasedStream(events, lease, SSE)
        outs = await collect(ctx, model, work, req.user)
        body = fmt.completion_response(reply, outs, req.logprobs)
        return JSONResponse(body, headers={"X-Request-Id": ctx.request_id})


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """Every model the seat serves, loaded or not."""
    seat = seat_of(request)
    return {"object": "list", "data": [_model_card(name, seat.started) for name in seat.host.names]}


@router.get("/v1/models/{name:path}")
async def get_model(request: Request, name: str) -> dict[str, Any]:
    """One model's card (404 when the seat does not serve it)."""
    seat = seat_of(request)
    return _model_card(seat.host.spec(name).name, seat.started)


def _model_card(name: str, created: float) -> dict[str, Any]:
    """A ``model`` object."""
    return {"id": name, "object": "model", "created": int(created), "owned_by": "nxctl"}


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    """Mean-pooled embeddings of each input (floats, or base64 of float32)."""
    seat = seat_of(request)
    req = await parse_body(request, EmbeddingRequest)
    async with seat.lease(req.model) as model:
        token_lists = await embedding_ids(req, model)
        vectors = await asyncio.to_thread(embed, model, token_lists)
    total = sum(len(t) for t in token_lists)
    note(request, prompt_tokens=total)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": as_base64(v) if req.encoding_format == "base64" else v,
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": total, "total_tokens": total}
    return JSONResponse({"object": "list", "data": data, "model": req.model, "usage": usage})
