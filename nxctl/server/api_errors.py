"""APIError and the JSON error bodies of each API.

OpenAI:  ``{"error": {"message", "type", "param", "code"}}``     Ollama:  ``{"error": "message"}``
Which one a response uses depends on the path: ``/api/...`` is Ollama, everything else OpenAI.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from engine.errors import (
    CapacityError,
    InvalidRequestError,
    NxError,
    ShuttingDownError,
    UnknownModelError,
    WaitTimeoutError,
)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
RETRY_AFTER_S = "5"  # what a 503 for a wait that timed out, or a seat that stops, asks the client to wait


class APIError(Exception):
    """An HTTP error with a clear message. ``dead_letter``: a server-side failure to keep in the DLQ."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        dead_letter: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.dead_letter = dead_letter

    @property
    def kind(self) -> str:
        """OpenAI's error ``type`` for this status."""
        if self.status >= 500:
            return "server_error"
        return _TYPES.get(self.status, "invalid_request_error")


def is_ollama_path(path: str) -> bool:
    """Whether ``path`` belongs to the Ollama API (its errors are ``{"error": "message"}``)."""
    return path.startswith("/api/")


def error_body(path: str, err: APIError) -> dict[str, Any]:
    """The JSON body of ``err`` in the flavour of the API that ``path`` belongs to."""
    if is_ollama_path(path):
        return {"error": err.message}
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 naming the offending ``param`` when there is one."""
    return APIError(400, message, param=param)


def from_validation(exc: ValidationError) -> APIError:
    """A pydantic ValidationError as one 400 naming each bad field and what was wrong with it."""
    parts = []
    for item in exc.errors(include_url=False)[:8]:
        loc = ".".join(str(p) for p in item.get("loc", ())) or "body"
        parts.append(f"{loc}: {item.get('msg', 'invalid')}")
    first = exc.errors(include_url=False)[0].get("loc", ()) if exc.errors() else ()
    return bad_request("invalid request: " + "; ".join(parts), param=str(first[0]) if first else None)


def from_engine(exc: Exception) -> APIError:
    """A typed engine error as an APIError: bad parameters are the client's, a wait that timed out or a
    seat that stops is a 503 to retry, the rest the server's."""
    if isinstance(exc, UnknownModelError):
        return APIError(404, str(exc).strip("'\""), code="model_not_found")
    if isinstance(exc, WaitTimeoutError | ShuttingDownError):
        return APIError(503, str(exc), headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, InvalidRequestError | CapacityError):
        return bad_request(str(exc))
    if isinstance(exc, NxError):
        return APIError(500, f"{type(exc).__name__}: {exc}", dead_letter=True)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", dead_letter=True)


def as_api_error(exc: Exception) -> APIError:
    """``exc`` itself when it is an APIError, else its translation (``from_engine``)."""
    return exc if isinstance(exc, APIError) else from_engine(exc)
