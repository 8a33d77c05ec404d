"""The Ollama API: /api/chat and /api/generate (NDJSON streaming by default), /api/embed, /api/show,
/api/tags, /api/ps, /api/version.

/api/chat and /api/generate pass each stage once, in order: request_context.read_request -> seat.lease
(with the request's keep_alive) -> to_engine_params.ollama_*_work -> generation.stream | collect ->
ollama_format. An empty ``messages`` (chat) or ``prompt`` (generate) loads the model, or unloads it with
keep_alive 0, as Ollama does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nxctl import __version__
from nxctl.server import ollama_format
from nxctl.server.embeddings import embed
from nxctl.server.generation import Work, collect, stream
from nxctl.server.host import SeatModel
from nxctl.server.lease import LeasedStream
from nxctl.server.model_info import chat_template, iso_time, model_info
from nxctl.server.ollama_format import NS, Endpoint, OllamaReply
from nxctl.server.request_context import RequestContext, note, parse_body, read_request, seat_of
from nxctl.server.schemas_ollama import ChatRequest, EmbedRequest, GenerateRequest, ShowRequest
from nxctl.server.settings import DEFAULT_NUM_CTX
from nxctl.server.to_engine_params import ollama_chat_work, ollama_embed_ids, ollama_generate_work

router = APIRouter()
NDJSON = "application/x-ndjson"
FOREVER = "2318-11-26T00:00:00Z"  # what Ollama's /api/ps shows for a model kept forever
ToWork = Callable[[Any, SeatModel, int], Awaitable[Work]]


async def _generate(ctx: RequestContext[Any], to_work: ToWork, endpoint: Endpoint) -> Response:
    """One chat or generate turn: NDJSON lines (the stream owns the lease) unless ``stream`` is false."""
    req = ctx.body
    lease = ctx.seat.lease(req.model, req.keep(), ctx.timeline)
    async with lease as model:
        work = await to_work(req, model, ctx.seat.settings.default_max_tokens)
        reply = OllamaReply(
            req.model,
            endpoint,
            model.tokenizer,
            bool(req.logprobs),
            ctx.arrival,
            lease.load_seconds,
            work.shape,
        )
        if req.stream is not False:
            return LeasedStream(ollama_format.ndjson(stream(ctx, model, work), reply), lease, NDJSON)
        (out,) = await collect(ctx, model, work)
        return JSONResponse(ollama_format.answer(reply, out))


async def _load_or_unload(ctx: RequestContext[Any], endpoint: Endpoint) -> Response:
    """Ollama's empty request: load the model (done_reason "load"), or unload it with keep_alive 0."""
    name, keep, seat = ctx.body.model, ctx.body.keep(), ctx.seat
    if keep.unloads_now:
        seat.host.spec(name)
        await asyncio.to_thread(seat.host.unload, name)
        reason: Literal["load", "unload"] = "unload"
    else:
        async with seat.lease(name, keep, ctx.timeline):
            reason = "load"
    return JSONResponse(ollama_format.loaded(name, endpoint, reason))


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    """A chat turn (or, with no messages, a load / unload)."""
    ctx = await read_request(request, ChatRequest, "ollama")
    if not ctx.body.messages:
        return await _load_or_unload(ctx, "chat")
    return await _generate(ctx, ollama_chat_work, "chat")


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    """A completion of a prompt (or, with neither prompt nor context, a load / unload)."""
    ctx = await read_request(request, GenerateRequest, "ollama")
    if not ctx.body.prompt and not ctx.body.context:
        return await _load_or_unload(ctx, "generate")
    return await _generate(ctx, ollama_generate_work, "generate")


@router.post("/api/embed")
async def embed_route(request: Request) -> Response:
    """Mean-pooled embeddings of each input."""
    seat, started = seat_of(request), time.perf_counter()
    req = await parse_body(request, EmbedRequest)
    lease = seat.lease(req.model, req.keep())
    async with lease as model:
        lists = await ollama_embed_ids(req, model)
        vectors = await asyncio.to_thread(embed, model, lists)
    total = sum(len(t) for t in lists)
    note(request, prompt_tokens=total)
    return JSONResponse(
        {
            "model": req.model,
            "embeddings": vectors,
            "total_duration": int((time.perf_counter() - started) * NS),
            "load_duration": int(lease.load_seconds * NS),
            "prompt_eval_count": total,
        }
    )


@router.post("/api/show")
async def show(request: Request) -> Response:
    """A model's details, parameters and chat template."""
    seat = seat_of(request)
    req = await parse_body(request, ShowRequest)
    spec = seat.host.spec(req.model_name())
    info = await asyncio.to_thread(model_info, spec)
    template = await asyncio.to_thread(chat_template, spec)
    params = f"num_ctx {min(DEFAULT_NUM_CTX, info.config.max_position_embeddings)}"
    return JSONResponse(
        {
            "license": "",
            "modelfile": f"FROM {spec.source}\n",
            "parameters": params,
            "template": template,
            "details": info.details(),
            "model_info": info.model_info(),
            "capabilities": ["completion", "embedding"],
            "modified_at": info.modified_at,
        }
    )


def _tag(name: str) -> str:
    """A model's name as an Ollama tag (``:latest`` unless it names one)."""
    return f"{name}:latest" if ":" not in name else name


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Every model the seat serves, loaded or not."""
    seat = seat_of(request)
    models = []
    for name in seat.host.names:
        info = await asyncio.to_thread(model_info, seat.host.spec(name))
        tag = _tag(name)
        models.append(
            {
                "name": tag,
                "model": tag,
                "modified_at": info.modified_at,
                "size": info.file_bytes,
                "digest": info.digest,
                "details": info.details(),
            }
        )
    return {"models": models}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    """The loaded models, their memory and when they expire."""
    seat = seat_of(request)
    models = []
    for r in seat.host.resident():
        info = await asyncio.to_thread(model_info, r.model.spec)
        tag = _tag(r.model.name)
        on_gpu = r.model.llm.engine.device.type == "cuda"
        size = r.model.footprint.held_bytes
        models.append(
            {
                "name": tag,
                "model": tag,
                "size": size,
                "digest": info.digest,
                "details": info.details(),
                "expires_at": FOREVER if r.expires_at is None else iso_time(r.expires_at),
                "size_vram": size if on_gpu else 0,
                "context_length": r.model.context_tokens,
            }
        )
    return {"models": models}


@router.get("/api/version")
async def version() -> dict[str, str]:
    """The seat's version."""
    return {"version": __version__}
