"""The Responses API: /v1/responses, stateless (nothing is stored), streaming or not.

The request is translated into a chat completion (schemas_responses.ResponsesRequest.as_chat) and
runs through the same stages as /v1/chat/completions; only the last stage differs
(responses_format: output items and typed events).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nxctl.server.api_errors import APIError
from nxctl.server.generation import collect, stream
from nxctl.server.lease import LeasedStream
from nxctl.server.request_context import read_request
from nxctl.server.responses_format import ResponseReply, response_body, response_events
from nxctl.server.schemas_responses import ResponsesRequest, in_responses_terms
from nxctl.server.to_engine_params import chat_work

router = APIRouter()


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
            events = response_events(stream(ctx, model, work, req.user), reply)
            return LeasedStream(events, lease, "text/event-stream")
        (out,) = await collect(ctx, model, work, req.user)
        return JSONResponse(response_body(reply, out), headers={"X-Request-Id": ctx.request_id})
