"""What one soak request got, from the client's side, and how a client's exception is read.

completed  a whole answer (200, finished, with its token counts)
refused    an error status the seat chose to send instead (4xx, or 503: shed, draining), by code
aborted    the client left on purpose (a disconnect mid-stream, a timeout it set itself)
failed     a server-side failure: a 5xx, or a stream that ended in an error event (each must be a
           dead letter: ``in_dlq``, set once the DLQ has been read)
lost       none of these: a reset or dropped connection, a truncated or malformed answer
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import httpx
import ollama
import openai

Outcome = Literal["completed", "refused", "aborted", "failed", "lost"]
Expect = Literal["answer", "refusal", "failure", "abort"]


class Incomplete(Exception):
    """A 200 answer that did not finish as its API says answers finish."""


class Left(Exception):
    """The client left on purpose (it closed the stream, or its own timeout ran out)."""


@dataclass
class Sent:
    """One request of the soak and what it got. Times are seconds since its phase began."""

    index: int
    kind: str
    marker: str
    started: float
    model: str | None = None
    expect: Expect = "answer"
    ended: float = 0.0
    outcome: Outcome = "lost"
    status: int | None = None
    detail: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None  # to the first chunk with text, for streams read at full speed
    itl: list[tuple[float, float]] = field(default_factory=list)  # (when, gap) between text chunks
    in_dlq: bool = False
    in_flight_at_sigterm: bool = False
    contract_ok: bool = True  # a refusal as expected: the right status, a JSON error, no CORS header
    seat_answer: tuple[int, int] | None = None  # a request the client left that the seat had answered
    seat_latency: float | None = None  # (prompt, completion tokens) and seconds, from the seat's log

    @property
    def request_id(self) -> str:
        """The X-Request-Id it is sent with (the seat's log line names it)."""
        return self.marker.strip("[]")

    @property
    def left_after(self) -> float:
        """Seconds from its start to its end (for a request the client left: when it left)."""
        return self.ended - self.started

    def complete(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.outcome, self.status = "completed", 200
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens


def status_outcome(status: int) -> Outcome:
    """An error status as an outcome: 5xx but 503 is a failure, the rest a refusal."""
    return "failed" if status >= 500 and status != 503 else "refused"


def read_exception(sent: Sent, exc: BaseException, draining: bool = False) -> None:
    """Set ``sent``'s outcome from the exception its request raised. ``draining``: the seat was told
    to stop, so a refused connection is a refusal, not a loss."""
    sent.detail = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    if isinstance(exc, Left):
        sent.outcome = "aborted"
    elif isinstance(exc, openai.APITimeoutError | httpx.TimeoutException) and sent.expect == "abort":
        sent.outcome = "aborted"
    elif isinstance(exc, openai.APIStatusError):
        sent.status, sent.outcome = exc.status_code, status_outcome(exc.status_code)
    elif isinstance(exc, openai.APIConnectionError):
        _connection(sent, exc.__cause__ or exc, draining)
    elif isinstance(exc, openai.APIError):  # an error event in a stream that had begun with 200
        sent.outcome, sent.status = "failed", _code(exc.body)
    elif isinstance(exc, ollama.ResponseError):
        # -1: an {"error": ...} line in a stream that had begun with 200
        sent.status = exc.status_code if exc.status_code > 0 else None
        sent.outcome = status_outcome(exc.status_code) if exc.status_code > 0 else "failed"
    else:  # httpx errors, ollama's ConnectionError, Incomplete, anything unexpected
        _connection(sent, exc, draining)


def _connection(sent: Sent, exc: BaseException, draining: bool) -> None:
    refused = isinstance(exc, httpx.ConnectError | ConnectionRefusedError) or (
        isinstance(exc, ConnectionError) and not isinstance(exc, ConnectionResetError)
    )
    sent.outcome = "refused" if refused and draining else "lost"


def _code(body: object) -> int | None:
    """The status code an OpenAI stream's error event carries in ``error.code``."""
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, int) else None
