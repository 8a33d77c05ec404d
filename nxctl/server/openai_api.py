"""The OpenAI API's routes that do not generate: /v1/models, /v1/models/{name}, /v1/embeddings
(/v1/chat/completions: openai_chat.py; /v1/completions: openai_completions.py; /v1/responses:
openai_responses.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nxctl.server.embeddings import as_base64, embed
from nxctl.server.host import SeatModel
from nxctl.server.openai_sampling import check_prompt
from nxctl.server.request_context import note, parse_body, seat_of
from nxctl.server.schemas_openai import EmbeddingRequest
from nxctl.server.tokens import prompt_ids

router = APIRouter()


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


async def embedding_ids(req: EmbeddingRequest, model: SeatModel) -> list[list[int]]:
    """Each input's token ids (a 400 when one is empty or longer than the context)."""
    lists = []
    for item in req.inputs():
        ids = await prompt_ids(model, item, "an input", "input")
        check_prompt(len(ids), model.context_tokens + 1)
        lists.append(ids)
    return lists
