"""OpenTelemetry traces of the seat: one span per generation request, its phases as children (queue,
prefill, decode, and the model load it set off), GenAI attributes; nothing at all when tracing is off."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engine.settings import EngineSettings
from engine.testing import fail_requests
from nxctl.server import timeline as timeline_module
from nxctl.server import tracing
from nxctl.server.app import create_app
from nxctl.server.bridge import CoreLease
from nxctl.server.models import make_loader
from nxctl.server.request_spans import WallClock
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

USER = [{"role": "user", "content": "hi"}]
PHASES = ("nxctl.queue", "nxctl.prefill", "nxctl.decode")


@dataclass
class TracedSeat:
    url: str
    app: Any
    exporter: InMemorySpanExporter
    lease: CoreLease  # the engine's forwards: a test holding it pauses every step
    first: str  # the response id of the request that loaded the model

    @property
    def engine(self) -> Any:
        return self.app.state.seat.host.loaded("tiny").llm.engine


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedSeat]:
    """A seat on tiny with a 12-block KV pool (192 tokens: n = 4 long answers preempt), its spans kept
    in memory. Nothing is preloaded: the first request, made here, loads the model."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lease = CoreLease()
    tmp = tmp_path_factory.mktemp("traced")
    settings = SeatSettings(
        models=("tiny",),
        dlq_path=tmp / "dlq.sqlite",
        log_requests=False,
        keep_alive_s=None,
        engine=EngineSettings(num_kv_blocks=12),
    )
    app = create_app(settings, loader=make_loader("cpu", lease), preload=False, tracer_provider=provider)
    with BackgroundSeat(app) as url:
        body = {"model": "tiny", "messages": USER, "max_tokens": 2}
        r = httpx.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": "first"}, timeout=60)
        assert r.status_code == 200
        yield TracedSeat(url, app, exporter, lease, "first")


def wait_for_root(exporter: InMemorySpanExporter, response_id: str, timeout: float = 10.0) -> ReadableSpan:
    """The request's span (its children are written before it ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for span in exporter.get_finished_spans():
            if (
                span.kind is SpanKind.SERVER
                and (span.attributes or {}).get("gen_ai.response.id") == response_id
            ):
                return span
        time.sleep(0.02)
    raise AssertionError(f"no span for {response_id}")


def children(exporter: InMemorySpanExporter, root: ReadableSpan) -> list[ReadableSpan]:
    assert root.context is not None
    return sorted(
        (s for s in exporter.get_finished_spans() if s.parent and s.parent.span_id == root.context.span_id),
        key=lambda s: (s.start_time or 0, s.name),
    )


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, tuple | list) else v for k, v in (span.attributes or {}).items()}


def check_phases_in_order(root: ReadableSpan, phases: list[ReadableSpan]) -> None:
    """queue -> prefill -> decode, back to back, inside the request's span."""
    assert [p.name for p in phases] == list(PHASES)[: len(phases)]
    assert root.start_time is not None and root.end_time is not None
    assert root.start_time <= phases[0].start_time  # type: ignore[operator]
    for before, after in zip(phases, phases[1:], strict=False):
        assert before.end_time == after.start_time
    for p in phases:
        assert p.start_time <= p.end_time <= root.end_time  # type: ignore[operator]


def test_a_streamed_request_is_one_span_with_queue_prefill_and_decode(traced: TracedSeat) -> None:
    body = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 6,
        "ignore_eos": True,
        "temperature": 0.5,
        "top_p": 0.9,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", traced.url + "/v1/chat/completions", json=body, headers={"x-request-id": "s1"}, timeout=30
    ) as r:
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    usage = data[-1]["usage"]
    root = wait_for_root(traced.exporter, "s1")
    assert root.name == "chat tiny" and root.kind is SpanKind.SERVER
    assert root.status.status_code is StatusCode.UNSET
    a = attrs(root)
    assert a["gen_ai.operation.name"] == "chat" and a["nxctl.api"] == "openai" and a["nxctl.stream"] is True
    assert a["gen_ai.request.model"] == "tiny" and a["gen_ai.response.model"] == "tiny"
    assert a["gen_ai.request.max_tokens"] == 6
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["nxctl.preemptions"] == 0 and "nxctl.prefix_cache.hit_tokens" in a
    assert a["http.response.status_code"] == 200 and "gen_ai.request.choice.count" not in a
    phases = children(traced.exporter, root)
    check_phases_in_order(root, phases)
    assert len(phases) == 3  # the model was loaded already: no load span
    assert {p.context.trace_id for p in phases} == {root.context.trace_id}  # type: ignore[union-attr]
    assert attrs(phases[2])["gen_ai.usage.output_tokens"] == 6
    assert attrs(phases[2])["nxctl.finish_reason"] == "length"
    assert attrs(phases[1])["nxctl.prompt_tokens"] == usage["prompt_tokens"]


def test_the_request_that_loaded_the_model_has_a_load_span(traced: TracedSeat) -> None:
    root = wait_for_root(traced.exporter, traced.first)
    spans = children(traced.exporter, root)
    assert [s.name for s in spans] == ["nxctl.model_load", *PHASES]
    load, queue = spans[0], spans[1]
    assert attrs(load)["gen_ai.response.model"] == "tiny"
    assert root.start_time <= load.start_time <= load.end_time <= queue.start_time  # type: ignore[operator]
    assert attrs(root)["nxctl.stream"] is False


def test_a_preempted_request_counts_its_preemptions_per_choice(traced: TracedSeat) -> None:
    body = {"model": "tiny", "messages": USER, "max_tokens": 60, "ignore_eos": True, "n": 4}
    r = httpx.post(
        traced.url + "/v1/chat/completions", json=body, headers={"x-request-id": "pre"}, timeout=60
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == 4
    root = wait_for_root(traced.exporter, "pre")
    a = attrs(root)
    assert a["gen_ai.request.choice.count"] == 4
    assert a["gen_ai.response.finish_reasons"] == ("length",) * 4
    assert a["gen_ai.usage.output_tokens"] == 240
    assert a["nxctl.preemptions"] > 0  # 4 x ~75 tokens in a 192-token pool
    spans = children(traced.exporter, root)
    by_choice: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        by_choice.setdefault(attrs(s)["nxctl.choice.index"], []).append(s)
    assert sorted(by_choice) == [0, 1, 2, 3]
    for phases in by_choice.values():
        check_phases_in_order(root, sorted(phases, key=lambda s: PHASES.index(s.name)))
    decodes = [s for s in spans if s.name == "nxctl.decode"]
    assert sum(attrs(s)["nxctl.preemptions"] for s in decodes) == a["nxctl.preemptions"]


def test_a_client_that_leaves_mid_stream_ends_its_span_with_abort(traced: TracedSeat) -> None:
    body = {"model": "tiny", "messages": USER, "max_tokens": 150, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", traced.url + "/v1/chat/completions", json=body, headers={"x-request-id": "gone"}, timeout=30
    ) as r:
        contents = 0
        for line in r.iter_lines():
            contents += '"content"' in line
            if contents >= 3:
                break
        traced.lease.__enter__()  # no more steps: the answer cannot finish before the client leaves
    try:
        root = wait_for_root(traced.exporter, "gone")
    finally:
        traced.lease.__exit__()
    a = attrs(root)
    assert a["gen_ai.response.finish_reasons"] == ("abort",)
    assert root.status.status_code is StatusCode.UNSET  # leaving is the client's right, not a failure
    assert 0 < a["gen_ai.usage.output_tokens"] < 150
    phases = children(traced.exporter, root)
    check_phases_in_order(root, phases)
    assert attrs(phases[-1])["nxctl.finish_reason"] == "abort"


def test_a_failed_request_has_status_error_with_its_message(traced: TracedSeat) -> None:
    body = {"model": "tiny", "messages": USER, "max_tokens": 4}
    with fail_requests(traced.engine, "boom-0", "sboom-0"):
        r = httpx.post(
            traced.url + "/v1/chat/completions", json=body, headers={"x-request-id": "boom"}, timeout=30
        )
        assert r.status_code == 500
        with httpx.stream(
            "POST",
            traced.url + "/v1/chat/completions",
            json={**body, "stream": True},
            headers={"x-request-id": "sboom"},
            timeout=30,
        ) as s:
            list(s.iter_lines())
    for rid, status in (("boom", 500), ("sboom", 200)):  # a stream reports its error in its last event
        root = wait_for_root(traced.exporter, rid)
        assert root.status.status_code is StatusCode.ERROR
        assert "engine error" in (root.status.description or "")
        assert attrs(root)["gen_ai.response.finish_reasons"] == ("error",)
        assert attrs(root)["http.response.status_code"] == status
    assert attrs(wait_for_root(traced.exporter, "boom"))["error.type"] == "500"


def test_a_refused_request_is_traced_as_an_error_without_phases(traced: TracedSeat) -> None:
    before = len(traced.exporter.get_finished_spans())
    r = httpx.post(traced.url + "/v1/chat/completions", json={"model": "tiny", "messages": []}, timeout=30)
    assert r.status_code == 400
    deadline = time.monotonic() + 10
    while len(traced.exporter.get_finished_spans()) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    (root,) = traced.exporter.get_finished_spans()[before:]
    assert root.name == "chat tiny" and root.status.status_code is StatusCode.ERROR
    assert attrs(root)["error.type"] == "400" and "gen_ai.response.finish_reasons" not in attrs(root)


@pytest.mark.parametrize(
    ("path", "body", "api", "operation", "streamed"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, "openai", "text_completion", False),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2}, "responses", "chat", False),
        ("/api/chat", {"messages": USER, "options": {"num_predict": 2}}, "ollama", "chat", True),
        (
            "/api/generate",
            {"prompt": "hi", "stream": False, "options": {"num_predict": 2, "temperature": 0}},
            "ollama",
            "text_completion",
            False,
        ),
    ],
)
def test_every_generation_api_is_traced(
    traced: TracedSeat, path: str, body: dict, api: str, operation: str, streamed: bool
) -> None:
    rid = f"api-{api}-{operation}"
    r = httpx.post(
        traced.url + path, json={"model": "tiny", **body}, headers={"x-request-id": rid}, timeout=30
    )
    assert r.status_code == 200
    a = attrs(root := wait_for_root(traced.exporter, rid))
    assert root.name == f"{operation} tiny"
    assert (a["nxctl.api"], a["gen_ai.operation.name"], a["nxctl.stream"]) == (api, operation, streamed)
    assert a["gen_ai.request.max_tokens"] == 2 and a["gen_ai.usage.output_tokens"] <= 2
    assert [s.name for s in children(traced.exporter, root)] == list(PHASES)


def test_a_caller_trace_context_is_joined(traced: TracedSeat) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = {"model": "tiny", "messages": USER, "max_tokens": 1}
    headers = {"x-request-id": "joined", "traceparent": parent}
    httpx.post(traced.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    root = wait_for_root(traced.exporter, "joined")
    assert root.context is not None and root.parent is not None
    assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{root.parent.span_id:016x}" == "b7ad6b7169203331"


def test_tracing_is_on_only_when_an_otlp_endpoint_is_configured() -> None:
    assert tracing.traces_endpoint({}) is None
    assert tracing.provider_from_env({}) is None
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"}
    assert tracing.traces_endpoint(base) == "http://127.0.0.1:4318/v1/traces"
    own = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/t"}
    assert tracing.traces_endpoint(own) == "http://127.0.0.1:9/t"
    assert tracing.provider_from_env({**base, "OTEL_SDK_DISABLED": "true"}) is None
    provider = tracing.provider_from_env(base)
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "nxctl"
    provider.shutdown()  # nothing was recorded: nothing is sent


def test_with_tracing_off_no_timeline_and_no_span_is_ever_made(
    seat, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    monkeypatch.setattr(timeline_module, "RequestTimeline", lambda *a: made.append("timeline"))
    monkeypatch.setattr(tracing, "write_spans", lambda *a: made.append("spans"))
    assert seat.app.state.seat.tracer is None
    assert not any(m.cls is tracing.TraceRequests for m in seat.app.user_middleware)
    body = {"model": "tiny", "messages": USER, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", seat.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and list(r.iter_lines())
    assert made == []
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no global provider set


def test_the_wall_clock_maps_perf_counter_to_epoch_nanoseconds() -> None:
    clock = WallClock()
    now = time.perf_counter()
    assert abs(clock.ns(now) - time.time_ns()) < 50_000_000
    assert clock.ns(now + 1.5) - clock.ns(now) == 1_500_000_000
