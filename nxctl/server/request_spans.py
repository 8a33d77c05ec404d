"""The spans of one generation request, written after the fact from its timeline (nxctl/server/timeline.py).

    chat tiny                  SERVER   arrival at the seat -> response ended; the GenAI attributes
    |- nxctl.model_load                 the model load this request set off
    |- nxctl.queue                      job handed to the engine loop -> first scheduled in a step
    |- nxctl.prefill                    first scheduled -> first token
    '- nxctl.decode                     first token -> finished, or the client left

One queue / prefill / decode trio per job (``nxctl.choice.index`` when a request asks for n > 1
choices); a phase the job never reached has no span. Every span is made with explicit start and end
times once the response has ended, so nothing is traced across threads and nothing stays open.
Attribute names follow OpenTelemetry's GenAI semantic conventions; ours are under ``nxctl.``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from engine.outputs import RequestOutput
from nxctl.server.timeline import JobRecord, RequestTimeline

PROVIDER = "nxctl"
Attributes = dict[str, AttributeValue]


class WallClock:
    """``time.perf_counter()`` seconds as Unix-epoch nanoseconds, through one offset taken at creation
    (so every span of the seat's life is placed consistently, whatever the wall clock does later)."""

    def __init__(self) -> None:
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def ns(self, seconds: float) -> int:
        return round(seconds * 1e9) + self._offset_ns


@dataclass(frozen=True)
class Ending:
    """How the HTTP request ended: when (perf_counter), its status code, the error it answered with."""

    at: float
    status: int
    error: str | None = None


def finish_reason(job: JobRecord) -> str:
    """The engine's finish reason; ``abort`` for a job its client left, ``error`` for one never run."""
    out = job.output
    if out is not None and out.finish_reason is not None:
        return out.finish_reason
    return "abort" if job.left_at is not None else "error"


def _request_attributes(timeline: RequestTimeline, ending: Ending) -> Attributes:
    """The root span's attributes."""
    attrs: Attributes = {
        "gen_ai.operation.name": timeline.operation,
        "gen_ai.provider.name": PROVIDER,
        "nxctl.api": timeline.api,
        "http.response.status_code": ending.status,
    }
    if timeline.model is not None:
        attrs["gen_ai.request.model"] = timeline.model
    asked = timeline.asked
    if asked is not None:
        attrs["nxctl.stream"] = asked.streamed
        given = {
            "gen_ai.request.max_tokens": asked.max_tokens,
            "gen_ai.request.temperature": asked.temperature,
            "gen_ai.request.top_p": asked.top_p,
        }
        attrs.update({key: value for key, value in given.items() if value is not None})
        if asked.choices != 1:
            attrs["gen_ai.request.choice.count"] = asked.choices
    if timeline.response_id is not None:
        attrs["gen_ai.response.id"] = timeline.response_id
    if timeline.response_model is not None:
        attrs["gen_ai.response.model"] = timeline.response_model
    if timeline.prompt_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = timeline.prompt_tokens
    if timeline.jobs:
        outs = [job.output for job in timeline.jobs if job.output is not None]
        attrs["gen_ai.usage.output_tokens"] = sum(len(out.token_ids) for out in outs)
        attrs["gen_ai.response.finish_reasons"] = [finish_reason(job) for job in timeline.jobs]
        attrs["nxctl.preemptions"] = sum(out.num_preemptions for out in outs)
        attrs["nxctl.prefix_cache.hit_tokens"] = sum(out.num_cached_tokens for out in outs)
    if ending.error is not None:
        attrs["error.type"] = str(ending.status)
    return attrs


Phase = tuple[str, float, float, Attributes]  # name, start, end (perf_counter), attributes


def _phases(job: JobRecord, submitted: float, ended: float) -> list[Phase]:
    """The phases the job reached."""
    out: RequestOutput | None = job.output
    left = job.left_at if job.left_at is not None else ended
    if out is None:
        return [("nxctl.queue", submitted, left, {})]
    end = out.finish_time if out.finish_time is not None else left
    scheduled, first = out.first_scheduled_time, out.first_token_time
    phases: list[Phase] = [("nxctl.queue", submitted, scheduled if scheduled is not None else end, {})]
    if scheduled is not None:
        prefill: Attributes = {
            "nxctl.prompt_tokens": len(out.prompt_token_ids),
            "nxctl.prefix_cache.hit_tokens": out.num_cached_tokens,
        }
        phases.append(("nxctl.prefill", scheduled, first if first is not None else end, prefill))
    if first is not None:
        decode: Attributes = {
            "gen_ai.usage.output_tokens": len(out.token_ids),
            "nxctl.preemptions": out.num_preemptions,
            "nxctl.finish_reason": finish_reason(job),
        }
        phases.append(("nxctl.decode", first, end, decode))
    return phases


def write_spans(
    tracer: trace.Tracer,
    clock: WallClock,
    timeline: RequestTimeline,
    ending: Ending,
    parent: Context | None = None,
) -> None:
    """Write the request's span tree (``parent``: the caller's trace context, from its headers)."""
    model = timeline.model or timeline.response_model
    name = f"{timeline.operation} {model}" if model else timeline.operation
    root = tracer.start_span(
        name,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=_request_attributes(timeline, ending),
        start_time=clock.ns(timeline.started),
    )
    if ending.error is not None:
        root.set_status(Status(StatusCode.ERROR, ending.error))
    inside = trace.set_span_in_context(root)

    def child(name: str, start: float, end: float, attrs: Attributes) -> None:
        span = tracer.start_span(name, context=inside, attributes=attrs, start_time=clock.ns(start))
        span.end(end_time=clock.ns(max(start, end)))

    load = timeline.model_load
    if load is not None:
        child("nxctl.model_load", load.start, load.end, {"gen_ai.response.model": load.model})
    submitted = timeline.submitted if timeline.submitted is not None else timeline.started
    for index, job in enumerate(timeline.jobs):
        for phase, start, end, attrs in _phases(job, submitted, ending.at):
            if len(timeline.jobs) > 1:
                attrs["nxctl.choice.index"] = index
            child(phase, start, end, attrs)
    root.end(end_time=clock.ns(ending.at))
