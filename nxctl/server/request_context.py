"""One request's context: its JSON body read and checked, the seat serving it, its id, when it arrived,
its trace timeline; and what it leaves behind: its log line's facts and, when it fails on the server's
side, a dead letter.

    ctx = await read_request(request, ChatCompletionRequest, "chatcmpl")   # 400s for a bad body
    ctx.body, ctx.seat, ctx.request_id, ctx.arrival, ctx.timeline

Routes that generate read their request so; the others parse their body alone (``parse_body``).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from nxctl.server.api_errors import bad_request, from_validation
from nxctl.server.seat import Seat
from nxctl.server.timeline import RequestTimeline, asked_of, timeline_of

T = TypeVar("T", bound=BaseModel)
log = logging.getLogger("nxctl.serve")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


@dataclass(frozen=True)
class RequestContext(Generic[T]):
    """What every stage of a generation request needs to know of it."""

    request: Request
    seat: Seat
    body: T
    request_id: str  # the client's X-Request-Id when it is a plain token, else ``<prefix>-<hex>``
    arrival: float  # perf_counter seconds, when the handler began
    timeline: RequestTimeline | None  # None unless the request is traced


async def read_request(request: Request, schema: type[T], id_prefix: str) -> RequestContext[T]:
    """The request's body checked against ``schema`` (every problem a clear 400) and its context."""
    arrival = time.perf_counter()
    body = await parse_body(request, schema)
    return RequestContext(
        request, seat_of(request), body, request_id(request, id_prefix), arrival, timeline_of(request)
    )


async def parse_body(request: Request, schema: type[T]) -> T:
    """The JSON body validated against ``schema`` (then its ``check()``); every problem is a clear 400.

    The raw body stays on ``request.state.body`` (a dead letter keeps it); what a generation request
    asked for goes on its timeline when it is traced."""
    raw = await request.body()
    request.state.body = raw
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise bad_request(f"the body must be a JSON object, got {type(data).__name__}")
    timeline = timeline_of(request)
    if isinstance(data.get("model"), str):
        note(request, model=data["model"])
        if timeline is not None:
            timeline.model = data["model"]
    try:
        parsed = schema.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc) from exc
    if timeline is not None:
        timeline.asked = asked_of(parsed)
    check = getattr(parsed, "check", None)
    if check is not None:
        check()
    return parsed


def request_id(request: Request, prefix: str) -> str:
    """The client's X-Request-Id when it is a plain token, else a fresh ``prefix-<hex>``."""
    given = request.headers.get("x-request-id", "")
    return given if _ID.match(given) else f"{prefix}-{uuid.uuid4().hex}"


def seat_of(request: Request) -> Seat:
    """The seat serving ``request``."""
    return request.app.state.seat


def note(request: Request, **fields: Any) -> None:
    """Facts for the request's log line (model, prompt_tokens, completion_tokens, error)."""
    request.state.log = {**getattr(request.state, "log", {}), **fields}


def dead_letter(request: Request, status: int, reason: str) -> None:
    """Record a server-side failure of ``request`` in the dead-letter store (never raises)."""
    seat = seat_of(request)
    if seat.dlq is None:
        return
    model = getattr(request.state, "log", {}).get("model")
    try:
        seat.dlq.record(
            method=request.method,
            path=request.url.path,
            status=status,
            reason=reason,
            model=model,
            body=getattr(request.state, "body", None),
        )
        seat.metrics.dead_letters.inc()
    except Exception:  # noqa: BLE001 - the store failing must not hide the request's own error
        log.exception("could not record a dead letter")
