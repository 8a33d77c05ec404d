"""What one generation request did, recorded as it happens for its trace (nxctl/server/tracing.py).

    tracing middleware          RequestTimeline(api, operation, started)   on request.state, when tracing
    request_context.parse_body  .model, .asked: the model named, and the sampling fields the client gave
    lease.ModelLease            .model_load   the model load this request set off
    generation.submit           .submit       the answer's id, the model serving it, its prompt tokens, its jobs
    generation.Generation       .submitted / .saw / .left: jobs handed over, their outputs, the moment it left
    tracing middleware          the spans, from this record, once the response has ended

Every time is ``time.perf_counter()`` seconds, the engine's clock. Only the event loop's thread writes a
timeline. With tracing off no timeline exists: ``timeline_of`` is None and nothing is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from engine.outputs import RequestOutput
from nxctl.server.schemas_ollama import ChatRequest, GenerateRequest
from nxctl.server.schemas_openai import ChatCompletionRequest, CompletionRequest
from nxctl.server.schemas_responses import ResponsesRequest

# the traced routes (POST): path -> (API, gen_ai.operation.name)
ROUTES: dict[str, tuple[str, str]] = {
    "/v1/chat/completions": ("openai", "chat"),
    "/v1/completions": ("openai", "text_completion"),
    "/v1/responses": ("responses", "chat"),
    "/api/chat": ("ollama", "chat"),
    "/api/generate": ("ollama", "text_completion"),
}
STATE_KEY = "timeline"


@dataclass(frozen=True)
class Asked:
    """What the client asked for; None where it did not say."""

    streamed: bool
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    choices: int = 1


def asked_of(req: Any) -> Asked | None:
    """The request's own fields (not the defaults the seat fills in), for a generation request's schema."""
    if isinstance(req, ChatCompletionRequest | CompletionRequest):
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return Asked(req.stream is True, limit, req.temperature, req.top_p, req.n or 1)
    if isinstance(req, ResponsesRequest):
        return Asked(req.stream is True, req.max_output_tokens, req.temperature, req.top_p)
    if isinstance(req, ChatRequest | GenerateRequest):
        opts = req.options
        if opts is None:
            return Asked(req.stream is not False)
        limit = opts.num_predict if opts.num_predict is not None and opts.num_predict > 0 else None
        return Asked(req.stream is not False, limit, opts.temperature, opts.top_p)
    return None


@dataclass(frozen=True)
class ModelLoad:
    """A model load a request set off: which model, and when it began and ended."""

    model: str
    start: float
    end: float


@dataclass
class JobRecord:
    """One engine request of the HTTP request: its newest output, and when the client left it unfinished."""

    output: RequestOutput | None = None
    left_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.output is not None and self.output.finished


@dataclass
class RequestTimeline:
    """One generation request as its trace needs it (mutated by the code above, on the event loop)."""

    api: str
    operation: str
    started: float
    model: str | None = None  # as the request named it
    asked: Asked | None = None
    model_load: ModelLoad | None = None
    response_id: str | None = None
    response_model: str | None = None
    prompt_tokens: int | None = None
    submitted: float | None = None
    jobs: list[JobRecord] = field(default_factory=list)

    def submit(self, response_id: str, model: str, prompt_tokens: int, jobs: int) -> None:
        """Its answer's id, the model serving it, its prompt tokens and ``jobs`` engine requests (mutates;
        ``submitted`` is set when they reach the engine loop)."""
        self.response_id, self.response_model, self.prompt_tokens = response_id, model, prompt_tokens
        self.jobs = [JobRecord() for _ in range(jobs)]

    def saw(self, index: int, output: RequestOutput) -> None:
        """Job ``index``'s newest output (cumulative; mutates)."""
        self.jobs[index].output = output

    def left(self, index: int, now: float) -> None:
        """Job ``index`` was aborted unfinished because its reader stopped (mutates)."""
        job = self.jobs[index]
        if not job.finished and job.left_at is None:
            job.left_at = now


def open_timeline(method: str, path: str, started: float) -> RequestTimeline | None:
    """A timeline for a request on a traced route, else None."""
    route = ROUTES.get(path) if method == "POST" else None
    return None if route is None else RequestTimeline(route[0], route[1], started)


def timeline_of(request: Request) -> RequestTimeline | None:
    """The request's timeline; None when tracing is off or the route is not traced."""
    return getattr(request.state, STATE_KEY, None)
