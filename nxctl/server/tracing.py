"""The seat's OpenTelemetry tracing: on when an OTLP endpoint is configured, else off and free.

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as is) or OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces) set
        -> provider_from_env(): a TracerProvider exporting over OTLP/HTTP in batches (the exporter's
           other OTEL_EXPORTER_OTLP_* settings and OTEL_SERVICE_NAME apply); OTEL_SDK_DISABLED=true wins
    neither -> None: no provider, no middleware, no timeline, no span is ever built

``TraceRequests`` (pure ASGI) puts a RequestTimeline on each generation request's state, lets the
stages fill it in, and once the response has ended (however it ended) hands it to ``SeatTracer.record``,
which writes its spans (request_spans.py). A request carrying a W3C ``traceparent`` joins that trace.
The seat builds its tracer once at start-up and shuts it down, flushing what is queued, on exit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.types import ASGIApp, Receive, Scope, Send

from nxctl import __version__
from nxctl.server.middleware import recording_status
from nxctl.server.request_spans import Ending, WallClock, write_spans
from nxctl.server.timeline import STATE_KEY, RequestTimeline, open_timeline

log = logging.getLogger("nxctl.serve")
SERVICE_NAME = "nxctl"
CLIENT_GONE = 499  # the status a request gets when its client left before the answer started


def traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """Where spans go (an OTLP/HTTP URL), or None when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return f"{base.rstrip('/')}/v1/traces" if base else None


def provider_from_env(
    environ: Mapping[str, str] | None = None, instance: str | None = None
) -> TracerProvider | None:
    """A provider exporting to the configured endpoint over OTLP/HTTP; None when none is configured.
    ``instance``: the replica this process is (`nxctl serve --ray`): the resource's ``nxctl.replica``
    and ``service.instance.id`` (in place of the SDK's random one), so every span it exports carries it."""
    env = os.environ if environ is None else environ
    endpoint = traces_endpoint(env)
    if endpoint is None:
        return None
    attrs = {"service.version": __version__}
    if instance is not None:
        attrs["service.instance.id"] = attrs["nxctl.replica"] = instance
    if not env.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = SERVICE_NAME
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class SeatTracer:
    """Writes each traced request's spans through ``provider``; ``shutdown`` flushes and stops it."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("nxctl.server", __version__)
        self._clock = WallClock()

    def record(self, timeline: RequestTimeline, ending: Ending, headers: Mapping[str, str]) -> None:
        """The request's spans (never raises: tracing must not fail a request)."""
        try:
            write_spans(self._tracer, self._clock, timeline, ending, propagate.extract(headers))
        except Exception:  # noqa: BLE001 - a tracing failure is logged, never the request's
            log.exception("could not write the spans of %s", timeline.response_id or timeline.operation)

    def shutdown(self) -> None:
        """Export what is queued, then stop (blocking: the exporter may wait on the network)."""
        self.provider.shutdown()


def _status_error(code: int) -> str | None:
    """An error answer the app noted no message for (a 401, a 413): its status; a client gone is none."""
    return f"HTTP {code}" if code >= 400 and code != CLIENT_GONE else None


class TraceRequests:
    """Pure-ASGI middleware: a timeline for each generation request, its spans once its response ended."""

    def __init__(self, app: ASGIApp, tracer: SeatTracer) -> None:
        self.app, self.tracer = app, tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request with its timeline on its state; record it however the response ended."""
        timeline = None
        if scope["type"] == "http":
            timeline = open_timeline(scope["method"], scope["path"], time.perf_counter())
        if timeline is None:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[STATE_KEY] = timeline
        send_status, status = recording_status(send)
        failure: str | None = None
        try:
            await self.app(scope, receive, send_status)
        except Exception as exc:  # answered by the app's last-resort handler, outside this middleware
            failure = f"internal error: {type(exc).__name__}: {exc}"
            raise
        finally:
            code = status[0] or (500 if failure else CLIENT_GONE)
            error = failure or state.get("log", {}).get("error") or _status_error(code)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
            self.tracer.record(timeline, Ending(time.perf_counter(), code, error), headers)
