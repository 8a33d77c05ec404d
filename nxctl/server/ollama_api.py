"""The Ollama API's routes that do not generate: /api/embed, /api/show, /api/tags, /api/ps, /api/version
(/api/chat and /api/generate: ollama_chat.py, ollama_generate.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from engine.errors import ModelFileError, UnknownModelError, UnsupportedModelError
from nxctl import __version__
from nxctl.server.api_errors import bad_request
from nxctl.server.embeddings import embed
from nxctl.server.host import SeatModel
from nxctl.server.model_info import capabilities, chat_tokenizer, iso_time, model_info
from nxctl.server.ollama_shared import NS
from nxctl.server.request_context import note, parse_body, seat_of
from nxctl.server.schemas_ollama import EmbedRequest, LegacyEmbeddingsRequest, ShowRequest
from nxctl.server.settings import DEFAULT_NUM_CTX

router = APIRouter()
log = logging.getLogger("nxctl.serve")
FOREVER = "2318-11-26T00:00:00Z"  # what Ollama's /api/ps shows for a model kept forever


@router.post("/api/embed")
async def embed_route(request: Request) -> Response:
    """Mean-pooled embeddings of each input (none: the model loaded, no vector)."""
    seat, started = seat_of(request), time.perf_counter()
    req = await parse_body(request, EmbedRequest)
    lease = seat.lease(req.model, req.keep())
    async with lease as model:
        lists = await embed_ids(req.inputs(), req.truncate, model)
        vectors = await asyncio.to_thread(embed, model, lists) if lists else []
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


@router.post("/api/embeddings")
async def legacy_embeddings(request: Request) -> Response:
    """Ollama's older route: one prompt's vector as ``embedding`` (an empty prompt: the model loaded,
    an empty vector)."""
    seat = seat_of(request)
    req = await parse_body(request, LegacyEmbeddingsRequest)
    async with seat.lease(req.model, req.keep()) as model:
        lists = await embed_ids([req.prompt] if req.prompt else [], req.truncate, model)
        vectors = await asyncio.to_thread(embed, model, lists) if lists else [[]]
    note(request, prompt_tokens=sum(len(t) for t in lists))
    return JSONResponse({"embedding": vectors[0]})


async def embed_ids(texts: list[str], truncate: bool | None, model: SeatModel) -> list[list[int]]:
    """Each text's token ids, cut to the context unless ``truncate`` is false (then a 400)."""
    lists = []
    for text in texts:
        ids = await asyncio.to_thread(model.tokenizer.encode_prompt, text) or [0]
        if len(ids) > model.context_tokens:
            if truncate is False:
                raise bad_request(f"input has {len(ids)} tokens; the context is {model.context_tokens}")
            ids = ids[: model.context_tokens]
        lists.append(ids)
    return lists


@router.post("/api/show")
async def show(request: Request) -> Response:
    """A model's details, parameters and chat template."""
    seat = seat_of(request)
    req = await parse_body(request, ShowRequest)
    spec = seat.host.spec(req.model_name())
    info = await asyncio.to_thread(model_info, spec)
    tok = await asyncio.to_thread(chat_tokenizer, spec)
    params = f"num_ctx {min(DEFAULT_NUM_CTX, info.config.max_position_embeddings)}"
    return JSONResponse(
        {
            "license": "",
            "modelfile": f"FROM {spec.source}\n",
            "parameters": params,
            "template": tok.chat_template or "",
            "details": info.details(),
            "model_info": info.model_info(),
            "capabilities": capabilities(tok),
            "modified_at": info.modified_at,
        }
    )


def _tag(name: str) -> str:
    """A model's name as an Ollama tag (``:latest`` unless it names one)."""
    return f"{name}:latest" if ":" not in name else name


@router.api_route("/", methods=["GET", "HEAD"])
async def running() -> Response:
    """Ollama's liveness answer (its CLI and many clients probe it before anything else)."""
    return PlainTextResponse("Ollama is running")


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(request: Request) -> dict[str, Any]:
    """Every model the seat serves, loaded or not (one whose file is missing or unreadable is left out
    with a warning in the log, as Ollama lists what it has)."""
    seat = seat_of(request)
    models = []
    for name in seat.host.names:
        try:
            info = await asyncio.to_thread(model_info, seat.host.spec(name))
        except (ModelFileError, UnknownModelError, UnsupportedModelError) as exc:
            log.warning("/api/tags leaves out %s: %s", name, exc)  # the others still list
            continue
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


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> dict[str, str]:
    """The seat's version."""
    return {"version": __version__}
