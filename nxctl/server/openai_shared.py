"""What the OpenAI endpoints' responses share: the Reply every body and chunk repeats, server-sent events,
``usage``, and the event that ends a stream that failed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from engine.loader import ChatTokenizer
from nxctl import __version__
from nxctl.server.api_errors import APIError, as_api_error
from nxctl.server.schemas_openai import SamplingFields
from nxctl.server.wire_json import compact_json

log = logging.getLogger("nxctl.serve")
FINGERPRINT = f"nxctl-{__version__}"
SSE = "text/event-stream"


@dataclass(frozen=True)
class Reply:
    """What every body and chunk of one OpenAI response shares."""

    request_id: str
    model: str  # the model as the request named it
    created: int  # Unix seconds
    tokenizer: ChatTokenizer
    prompt_tokens: int


def with_usage(req: SamplingFields) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
    return bool(req.stream_options and req.stream_options.include_usage)


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else compact_json(data)
    return f"data: {text}\n\n".encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_event(exc: Exception) -> bytes:
    """The event that ends a stream that failed with ``exc`` (generation.stream raises APIError only:
    anything else is a bug here, logged and sent as a 500)."""
    if not isinstance(exc, APIError):
        log.error("formatting a stream failed", exc_info=exc)
    err = as_api_error(exc)
    kind = "server_error" if err.status >= 500 else "invalid_request_error"
    return sse({"error": {"message": err.message, "type": kind, "param": None, "code": err.status}})
