"""The OpenAI API: /v1/chat/completions, /v1/completions (streaming SSE or not), /v1/models, /v1/embeddings."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.errors import InvalidRequestError
from engine.outputs import RequestOutput
from nxctl.server import openai_format as fmt
from nxctl.server.embeddings import as_base64, embed
from nxctl.server.errors import APIError, bad_request
from nxctl.server.generation import Generation, Job
from nxctl.server.handling import (
    LeasedStream,
    check_queue,
    note,
    parse_body,
    seat_of,
    stream_failure,
    until_disconnect,
)
from nxctl.server.host import SeatModel
from nxctl.server.sampling import check_ids, check_prompt, openai_params
from nxctl.server.schemas_openai import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from nxctl.server.tokens import chat_prompt_ids

router = APIRouter()
SSE = "text/event-stream"
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id(request: Request, prefix: str) -> str:
    """The client's X-Request-Id when it is a plain token, else a fresh ``prefix-<hex>``."""
    given = request.headers.get("x-request-id", "")
    return given if _ID.match(given) else f"{prefix}-{uuid.uuid4().hex}"


def failure(out: RequestOutput) -> APIError:
    """A job that ended in ``error`` or ``abort``: a server-side failure (kept as a dead letter)."""
    if out.finish_reason == "abort":
        return APIError(503, "the request was aborted: the seat is shutting down", dead_letter=True)
    return APIError(500, f"engine error: {out.error or 'unknown'}", dead_letter=True)


def raise_if_failed(outs: list[RequestOutput]) -> None:
    for out in outs:
        if out.finish_reason in ("error", "abort"):
            raise failure(out)


async def finals(request: Request, gen: Generation) -> list[RequestOutput]:
    """Every job's final output (unless the client leaves first); a failed job is a server error."""
    outs = await until_disconnect(request, gen.finals())
    raise_if_failed(outs)
    note(request, completion_tokens=sum(len(o.token_ids) for o in outs))
    return outs


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    seat, arrival = seat_of(request), time.perf_counter()
    req = await parse_body(request, ChatCompletionRequest)
    lease = seat.lease(req.model)
    async with lease as model:
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages
        ]
        try:
            ids = await asyncio.to_thread(chat_prompt_ids, model.tokenizer, messages)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), param="messages") from exc
        top = (req.top_logprobs or 0) if req.logprobs else None
        params = openai_params(req, len(ids), model.context_tokens, seat.settings.default_max_tokens, top)
        check_queue(seat, model)
        rid = request_id(request, "chatcmpl")
        gen = Generation(model, [Job(ids, p) for p in params], rid, seat.metrics, arrival, req.user)
        note(request, prompt_tokens=len(ids))
        if req.stream:
            return LeasedStream(_chat_stream(request, gen, req, rid, model, len(ids)), lease, SSE)
        outs = await finals(request, gen)
        body = fmt.chat_response(rid, req.model, int(time.time()), outs, model.tokenizer, bool(req.logprobs))
        return JSONResponse(body, headers={"X-Request-Id": rid})


async def _chat_stream(
    request: Request, gen: Generation, req: ChatCompletionRequest, rid: str, model: SeatModel, prompt_len: int
) -> AsyncIterator[bytes]:
    created = int(time.time())
    with_usage = bool(req.stream_options and req.stream_options.include_usage)
    want_lp = bool(req.logprobs)
    try:
        for i in range(len(gen.jobs)):
            first = {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield fmt.sse(fmt.chat_chunk(rid, req.model, created, [first], with_usage))
        async with aclosing(gen.deltas()) as deltas:
            async for delta in deltas:
                if delta.finish_reason in ("error", "abort"):
                    raise failure(delta.output)
                if delta.text or delta.finish_reason or (want_lp and delta.token_ids):
                    choice = fmt.chat_delta_choice(delta, model.tokenizer, want_lp)
                    yield fmt.sse(fmt.chat_chunk(rid, req.model, created, [choice], with_usage))
        completion = sum(len(s.final.token_ids) for s in gen.streams if s.final is not None)
        note(request, completion_tokens=completion)
        if with_usage:
            last = fmt.chat_chunk(rid, req.model, created, [], False)
            yield fmt.sse({**last, "usage": fmt.usage(prompt_len, completion)})
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        err = stream_failure(request, exc)
        yield fmt.error_event(err.message, err.status)
    yield fmt.sse("[DONE]")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    seat, arrival = seat_of(request), time.perf_counter()
    req = await parse_body(request, CompletionRequest)
    prompts = req.prompts()
    lease = seat.lease(req.model)
    async with lease as model:
        jobs: list[Job] = []
        prompt_tokens = 0
        for prompt in prompts:
            ids = (
                await asyncio.to_thread(model.tokenizer.encode, prompt)
                if isinstance(prompt, str)
                else list(prompt)
            )
            if not ids:
                raise bad_request("the prompt encodes to no tokens", param="prompt")
            check_ids(ids, model.llm.model_config.vocab_size)
            prompt_tokens += len(ids)
            params = openai_params(
                req, len(ids), model.context_tokens, seat.settings.default_max_tokens, req.logprobs
            )
            jobs.extend(Job(ids, p) for p in params)
        check_queue(seat, model)
        rid = request_id(request, "cmpl")
        gen = Generation(model, jobs, rid, seat.metrics, arrival, req.user)
        note(request, prompt_tokens=prompt_tokens)
        if req.stream:
            return LeasedStream(_completion_stream(request, gen, req, rid, model, prompt_tokens), lease, SSE)
        outs = await finals(request, gen)
        created = int(time.time())
        body = fmt.completion_response(
            rid, req.model, created, outs, model.tokenizer, req.logprobs, prompt_tokens
        )
        return JSONResponse(body, headers={"X-Request-Id": rid})


async def _completion_stream(
    request: Request, gen: Generation, req: CompletionRequest, rid: str, model: SeatModel, prompt_tokens: int
) -> AsyncIterator[bytes]:
    created = int(time.time())
    with_usage = bool(req.stream_options and req.stream_options.include_usage)
    base = {"id": rid, "object": "text_completion", "created": created, "model": req.model}
    offsets = [0] * len(gen.jobs)
    try:
        async with aclosing(gen.deltas()) as deltas:
            async for d in deltas:
                if d.finish_reason in ("error", "abort"):
                    raise failure(d.output)
                if not (d.text or d.finish_reason or d.token_ids):  # as vLLM: a chunk per step with tokens
                    continue
                lp = None
                if req.logprobs is not None:
                    lp = fmt.completion_logprobs(
                        model.tokenizer, d.token_ids, d.logprobs, d.top_logprobs, offsets[d.index]
                    )
                offsets[d.index] += len(d.text)
                finish = fmt.FINISH.get(d.finish_reason or "", "stop") if d.finish_reason else None
                choice = {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": finish}
                chunk = {**base, "choices": [choice], **({"usage": None} if with_usage else {})}
                yield fmt.sse(chunk)
        completion = sum(len(s.final.token_ids) for s in gen.streams if s.final is not None)
        note(request, completion_tokens=completion)
        if with_usage:
            yield fmt.sse({**base, "choices": [], "usage": fmt.usage(prompt_tokens, completion)})
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        err = stream_failure(request, exc)
        yield fmt.error_event(err.message, err.status)
    yield fmt.sse("[DONE]")


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    seat = seat_of(request)
    return {"object": "list", "data": [_model_card(name, seat.started) for name in seat.host.names]}


@router.get("/v1/models/{name:path}")
async def get_model(request: Request, name: str) -> dict[str, Any]:
    seat = seat_of(request)
    return _model_card(seat.host.spec(name).name, seat.started)


def _model_card(name: str, created: float) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created), "owned_by": "nxctl"}


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    seat = seat_of(request)
    req = await parse_body(request, EmbeddingRequest)
    inputs = req.inputs()
    async with seat.lease(req.model) as model:
        token_lists = []
        for item in inputs:
            ids = (
                await asyncio.to_thread(model.tokenizer.encode, item) if isinstance(item, str) else list(item)
            )
            if not ids:
                raise bad_request("an input encodes to no tokens", param="input")
            check_ids(ids, model.llm.model_config.vocab_size)
            check_prompt(len(ids), model.context_tokens + 1)
            token_lists.append(ids)
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
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }
    )
