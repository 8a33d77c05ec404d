"""The Ollama API: /api/chat and /api/generate (NDJSON streaming by default), /api/embed, /api/show,
/api/tags, /api/ps, /api/version.

An empty ``messages`` (chat) or ``prompt`` (generate) loads the model, or unloads it with keep_alive 0,
as Ollama does. A prompt longer than the context is truncated as Ollama truncates it: oldest turns first,
system messages kept (chat), or the prompt's oldest tokens (generate).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.errors import InvalidRequestError
from engine.outputs import RequestOutput
from nxctl import __version__
from nxctl.server.embeddings import embed
from nxctl.server.errors import bad_request
from nxctl.server.generation import Generation, Job
from nxctl.server.handling import (
    LeasedStream,
    check_queue,
    note,
    parse_body,
    seat_of,
    stream_failure,
)
from nxctl.server.host import SeatModel
from nxctl.server.model_info import chat_template, iso_time, model_info
from nxctl.server.openai_api import failure, finals, request_id
from nxctl.server.sampling import check_ids, ollama_context, ollama_max_tokens, ollama_params
from nxctl.server.schemas_ollama import ChatRequest, EmbedRequest, GenerateRequest, Options, ShowRequest
from nxctl.server.settings import DEFAULT_NUM_CTX, parse_duration
from nxctl.server.streaming import Delta
from nxctl.server.tokens import fit_messages, token_text

router = APIRouter()
NDJSON = "application/x-ndjson"
NS = 1_000_000_000
FOREVER = "2318-11-26T00:00:00Z"  # what Ollama's /api/ps shows for a model kept forever


def now_iso() -> str:
    return iso_time(time.time())


def keep_alive_of(value: str | float | int | None) -> float | None | str:
    """The request's keep_alive in seconds (None: forever), or "default" when absent."""
    if value is None:
        return "default"
    try:
        return parse_duration(value)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), param="keep_alive") from exc


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _logprobs(model: SeatModel, d: Delta) -> list[dict[str, Any]]:
    tok = model.tokenizer
    out = []
    for n, (token_id, lp) in enumerate(zip(d.token_ids, d.logprobs, strict=False)):
        tops = d.top_logprobs[n] if n < len(d.top_logprobs) else []
        alts = [{"token": token_text(tok, t), "logprob": v} for t, v in tops]
        out.append({"token": token_text(tok, token_id), "logprob": lp, "top_logprobs": alts})
    return out


def _final_fields(out: RequestOutput, arrival: float, load_s: float) -> dict[str, Any]:
    """The counts and durations (nanoseconds) of Ollama's last chunk."""
    first = out.first_token_time or out.finish_time or arrival
    finish = out.finish_time or time.perf_counter()
    return {
        "done_reason": "length" if out.finish_reason == "length" else "stop",
        "total_duration": int(max(finish - arrival, 0) * NS),
        "load_duration": int(load_s * NS),
        "prompt_eval_count": len(out.prompt_token_ids),
        "prompt_eval_duration": int(max(first - out.arrival_time, 0) * NS),
        "eval_count": len(out.token_ids),
        "eval_duration": int(max(finish - first, 0) * NS),
    }


class _Turn:
    """What chat and generate share: lease, limits, generation, stream or single answer."""

    def __init__(
        self,
        request: Request,
        model_name: str,
        options: Options | None,
        keep: float | None | str,
        logprobs: bool,
    ):
        self.request, self.seat, self.logprobs = request, seat_of(request), logprobs
        self.arrival = time.perf_counter()
        self.options = options
        self.lease = self.seat.lease(model_name, keep)

    def limits(self, model: SeatModel) -> tuple[int, int | None, int]:
        """(context, max tokens or None for 'until full', the prompt's token limit)."""
        ctx = ollama_context(self.options, model.context_tokens, DEFAULT_NUM_CTX)
        max_tokens = ollama_max_tokens(self.options, self.seat.settings.default_max_tokens)
        reserve = max(1, min(max_tokens or ctx // 4, ctx // 2))
        return ctx, max_tokens, ctx - reserve

    def generation(
        self, model: SeatModel, ids: list[int], ctx: int, max_tokens: int | None, top: int | None
    ) -> Generation:
        room = ctx - len(ids)
        params = ollama_params(self.options, room if max_tokens is None else min(max_tokens, room), top)
        check_queue(self.seat, model)
        note(self.request, prompt_tokens=len(ids))
        rid = request_id(self.request, "ollama")
        return Generation(model, [Job(ids, params)], rid, self.seat.metrics, self.arrival)

    async def answer(self, gen: Generation, stream: bool, shape: Any) -> Response:
        """Stream NDJSON (the stream owns the lease) or answer once; ``shape(text, delta_or_out, final)``."""
        if stream:
            return LeasedStream(self._stream(gen, shape), self.lease, NDJSON)
        (out,) = await finals(self.request, gen)
        whole = Delta(0, out.text, out.token_ids, out.logprobs, out.top_logprobs, out.finish_reason, out)
        return JSONResponse(shape(out.text, whole, _final_fields(out, self.arrival, self.lease.load_seconds)))

    async def _stream(self, gen: Generation, shape: Any) -> AsyncIterator[bytes]:
        try:
            async with aclosing(gen.deltas()) as deltas:
                async for d in deltas:
                    if d.finish_reason in ("error", "abort"):
                        raise failure(d.output)
                    if d.text or (self.logprobs and d.token_ids):
                        yield _line(shape(d.text, d, None))
                    if d.finish_reason:
                        note(self.request, completion_tokens=len(d.output.token_ids))
                        empty = Delta(d.index, "", [], [], [], d.finish_reason, d.output)
                        yield _line(
                            shape("", empty, _final_fields(d.output, self.arrival, self.lease.load_seconds))
                        )
        except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error line
            yield _line({"error": stream_failure(self.request, exc).message})


async def _load_or_unload(
    request: Request, name: str, keep: float | None | str, shape: dict[str, Any]
) -> Response:
    """Ollama's empty request: load the model (done_reason "load"), or unload it with keep_alive 0."""
    seat = seat_of(request)
    if keep == 0:
        seat.host.spec(name)
        await asyncio.to_thread(seat.host.unload, name)
        reason = "unload"
    else:
        async with seat.lease(name, keep):
            reason = "load"
    return JSONResponse(
        {"model": name, "created_at": now_iso(), **shape, "done": True, "done_reason": reason}
    )


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    req = await parse_body(request, ChatRequest)
    keep = keep_alive_of(req.keep_alive)
    if not req.messages:
        return await _load_or_unload(
            request, req.model, keep, {"message": {"role": "assistant", "content": ""}}
        )
    turn = _Turn(request, req.model, req.options, keep, bool(req.logprobs))
    async with turn.lease as model:
        ctx, max_tokens, limit = turn.limits(model)
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
        try:
            ids, _ = await asyncio.to_thread(fit_messages, model.tokenizer, messages, limit)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), param="messages") from exc
        top = (req.top_logprobs or 0) if req.logprobs else None
        gen = turn.generation(model, ids, ctx, max_tokens, top)

        def shape(text: str, d: Any, final: dict[str, Any] | None) -> dict[str, Any]:
            body: dict[str, Any] = {"model": req.model, "created_at": now_iso()}
            body["message"] = {"role": "assistant", "content": text}
            if req.logprobs:
                body["logprobs"] = _logprobs(model, d)
            return {**body, "done": final is not None, **(final or {})}

        return await turn.answer(gen, req.stream is not False, shape)


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    req = await parse_body(request, GenerateRequest)
    keep = keep_alive_of(req.keep_alive)
    if not req.prompt and not req.context:
        return await _load_or_unload(request, req.model, keep, {"response": ""})
    turn = _Turn(request, req.model, req.options, keep, bool(req.logprobs))
    async with turn.lease as model:
        ctx, max_tokens, limit = turn.limits(model)
        tok = model.tokenizer
        if req.raw or not tok.chat_template:
            ids = tok.encode(req.prompt or "")
        else:
            turns = ([{"role": "system", "content": req.system}] if req.system else []) + [
                {"role": "user", "content": req.prompt or ""}
            ]
            ids = await asyncio.to_thread(tok.encode_chat, turns, True)
        ids = list(req.context or []) + ids
        check_ids(ids, model.llm.model_config.vocab_size)
        ids = ids[-limit:]
        top = (req.top_logprobs or 0) if req.logprobs else None
        gen = turn.generation(model, ids, ctx, max_tokens, top)

        def shape(text: str, d: Any, final: dict[str, Any] | None) -> dict[str, Any]:
            body: dict[str, Any] = {"model": req.model, "created_at": now_iso(), "response": text}
            if req.logprobs:
                body["logprobs"] = _logprobs(model, d)
            if final is not None:
                body["context"] = list(d.output.prompt_token_ids) + list(d.output.token_ids)
            return {**body, "done": final is not None, **(final or {})}

        return await turn.answer(gen, req.stream is not False, shape)


@router.post("/api/embed")
async def embed_route(request: Request) -> Response:
    seat, started = seat_of(request), time.perf_counter()
    req = await parse_body(request, EmbedRequest)
    inputs = [req.input] if isinstance(req.input, str) else list(req.input)
    if not inputs or any(not text for text in inputs):
        raise bad_request("input must not be empty", param="input")
    lease = seat.lease(req.model, keep_alive_of(req.keep_alive))
    async with lease as model:
        lists = []
        for text in inputs:
            ids = await asyncio.to_thread(model.tokenizer.encode, text) or [0]
            if len(ids) > model.context_tokens:
                if req.truncate is False:
                    raise bad_request(f"input has {len(ids)} tokens; the context is {model.context_tokens}")
                ids = ids[: model.context_tokens]
            lists.append(ids)
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


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    seat = seat_of(request)
    models = []
    for name in seat.host.names:
        info = await asyncio.to_thread(model_info, seat.host.spec(name))
        tag = f"{name}:latest" if ":" not in name else name
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
    seat = seat_of(request)
    models = []
    for r in seat.host.resident():
        info = await asyncio.to_thread(model_info, r.model.spec)
        tag = f"{r.model.name}:latest" if ":" not in r.model.name else r.model.name
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
    return {"version": __version__}
