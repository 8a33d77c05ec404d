"""OpenAI's /v1/completions: a text completion of one or more prompts, as SSE chunks when ``stream``,
else one body.

A request's path, top to bottom: ``completions`` reads it (request_context: 400s), leases its model (404,
503), turns it into engine work here (``completion_work``: ``n`` jobs per prompt, a text or token ids,
under the grammar of its response format from structured_fields, SamplingParams from openai_sampling),
submits the work and reads it back (generation: 503 when the queue is full), and formats the answers
here, with legacy completions logprobs.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.loader import ChatTokenizer
from engine.outputs import RequestOutput
from nxctl.server.finish_reasons import api_finish, api_finish_or_none
from nxctl.server.generation import Job, Work, collect, stream
from nxctl.server.host import SeatModel
from nxctl.server.lease import LeasedStream
from nxctl.server.openai_sampling import openai_params
from nxctl.server.openai_shared import FINGERPRINT, SSE, Reply, error_event, sse, usage, with_usage
from nxctl.server.request_context import read_request
from nxctl.server.schemas_openai import CompletionRequest
from nxctl.server.streaming import Delta
from nxctl.server.structured_fields import Constraints, format_grammar
from nxctl.server.tokens import prompt_ids, token_text

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """A text completion of one or more prompts: SSE chunks when ``stream``, else one body."""
    ctx = await read_request(request, CompletionRequest, "cmpl")
    req = ctx.body
    lease = ctx.seat.lease(req.model, timeline=ctx.timeline)
    async with lease as model:
        work = await completion_work(req, model, ctx.seat.settings.default_max_tokens)
        reply = Reply(ctx.request_id, req.model, int(time.time()), model.tokenizer, work.prompt_tokens)
        if req.stream:
            events = completion_events(
                stream(ctx, model, work, req.user), reply, req.logprobs, with_usage(req)
            )
            return LeasedStream(events, lease, SSE)
        outs = await collect(ctx, model, work, req.user)
        body = completion_response(reply, outs, req.logprobs)
        return JSONResponse(body, headers={"X-Request-Id": ctx.request_id})


# ---- the request as engine work --------------------------------------------------------------------
async def completion_work(req: CompletionRequest, model: SeatModel, default_max: int) -> Work:
    """``n`` jobs per prompt (a text or token ids), in prompt order."""
    jobs: list[Job] = []
    prompt_tokens = 0
    asked = Constraints(response_format=req.response_format, structured_outputs=req.structured_outputs)
    grammar = await format_grammar(asked, model)
    vocab = model.llm.model_config.vocab_size
    for prompt in req.prompts():
        ids = await prompt_ids(model, prompt, "the prompt", "prompt")
        prompt_tokens += len(ids)
        params = openai_params(req, len(ids), model.context_tokens, default_max, req.logprobs, grammar, vocab)
        jobs.extend(Job(ids, p) for p in params)
    return Work(jobs, prompt_tokens)


# ---- the answers as the response -------------------------------------------------------------------
def completion_logprobs(
    tok: ChatTokenizer,
    ids: Sequence[int],
    lps: Sequence[float],
    tops: Sequence[Sequence[tuple[int, float]]],
    offset: int = 0,
) -> dict[str, Any]:
    """Legacy completions ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset (from ``offset``)."""
    tokens = [token_text(tok, t) for t in ids]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    top = [{token_text(tok, t): v for t, v in tops[n]} if n < len(tops) else {} for n in range(len(ids))]
    return {
        "tokens": tokens,
        "token_logprobs": list(lps[: len(ids)]),
        "top_logprobs": top,
        "text_offset": offsets,
    }


def completion_response(reply: Reply, outs: list[RequestOutput], logprobs: int | None) -> dict[str, Any]:
    """The ``text_completion`` body: one choice per final output."""
    choices = []
    for i, out in enumerate(outs):
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(reply.tokenizer, out.token_ids, out.logprobs, out.top_logprobs)
        finish = api_finish(out.finish_reason) if out.finish_reason else "stop"
        choices.append({"index": i, "text": out.text, "logprobs": lp, "finish_reason": finish})
    return {
        "id": reply.request_id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": usage(reply.prompt_tokens, sum(len(o.token_ids) for o in outs)),
        "system_fingerprint": FINGERPRINT,
    }


def completion_delta_choice(
    delta: Delta, tok: ChatTokenizer, logprobs: int | None, offset: int
) -> dict[str, Any]:
    """A text completion chunk's choice; ``offset``: the characters of this choice sent before."""
    lp = None
    if logprobs is not None:
        lp = completion_logprobs(tok, delta.token_ids, delta.logprobs, delta.top_logprobs, offset)
    finish = api_finish_or_none(delta.finish_reason)
    return {"index": delta.index, "text": delta.text, "logprobs": lp, "finish_reason": finish}


async def completion_events(
    deltas: AsyncGenerator[Delta, None], reply: Reply, logprobs: int | None, with_usage_chunk: bool
) -> AsyncIterator[bytes]:
    """The SSE stream of a text completion: a chunk per step with tokens (as vLLM), the usage chunk when
    asked, an error event if the stream fails, then ``[DONE]``."""
    base = {
        "id": reply.request_id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
    }
    offsets: dict[int, int] = {}
    completion = 0
    try:
        async with aclosing(deltas) as deltas_read:
            async for d in deltas_read:
                completion += len(d.output.token_ids) if d.finish_reason else 0
                if d.text or d.finish_reason or d.token_ids:
                    choice = completion_delta_choice(d, reply.tokenizer, logprobs, offsets.get(d.index, 0))
                    offsets[d.index] = offsets.get(d.index, 0) + len(d.text)
                    usage_field = {"usage": None} if with_usage_chunk else {}
                    yield sse({**base, "choices": [choice], **usage_field})
        if with_usage_chunk:
            yield sse({**base, "choices": [], "usage": usage(reply.prompt_tokens, completion)})
    except Exception as exc:  # noqa: BLE001 - a stream that fails still ends with an error event
        yield error_event(exc)
    yield sse("[DONE]")
