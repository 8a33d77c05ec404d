"""Stage 1 of a request: its JSON body parsed and validated against the API's pydantic schema."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from nxctl.server.api_errors import bad_request, from_validation
from nxctl.server.seat import note
from nxctl.server.timeline import asked_of, timeline_of

T = TypeVar("T", bound=BaseModel)


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
