"""create_app(settings): the FastAPI app of the seat, its error handlers, middleware and lifespan.

Middleware, outermost first: CORS (only when ``cors_origins`` are given; no CORS header otherwise),
the request spans (when tracing), the request log, the drain (counts requests in flight; 503 to new
ones once the seat drains), the API key (every path but /health), the body limit.

Start-up builds the model host (registry, budget, engine loops sharing one CoreLease), preloads the
``--model`` models and starts the keep_alive reaper; shutdown stops every engine loop (and flushes the
traces, when tracing). Every error is JSON in the flavour of its API (api_errors.py); server-side failures
are kept in the dead-letter store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from opentelemetry.sdk.trace import TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.errors import NxError
from engine.mux.registry import MB, ModelSpec
from nxctl import __version__
from nxctl.server import (
    ollama_api,
    ollama_chat,
    ollama_generate,
    openai_api,
    openai_chat,
    openai_completions,
    openai_responses,
)
from nxctl.server.api_errors import APIError, bad_request, error_body, from_engine
from nxctl.server.bridge import CoreLease
from nxctl.server.drain import Drain
from nxctl.server.faults import seat_dead_letters, with_engine_faults
from nxctl.server.generation import ClientGone
from nxctl.server.host import ModelHost, SeatModel
from nxctl.server.idle_pool import default_pool
from nxctl.server.middleware import ApiKey, BodyLimit, BodyTooLarge, RequestLog
from nxctl.server.models import make_loader, preload_names, seat_registry
from nxctl.server.prometheus_metrics import CONTENT_TYPE, SeatMetrics
from nxctl.server.request_context import dead_letter, note, seat_of
from nxctl.server.seat import Seat
from nxctl.server.settings import SeatSettings
from nxctl.server.tracing import SeatTracer, TraceRequests

log = logging.getLogger("nxctl.serve")
REAP_INTERVAL_S = 0.5
Loader = Callable[[ModelSpec], SeatModel]
# one module per API surface that generates, each its own path top to bottom; then the other routes
API_MODULES = (
    openai_chat,
    openai_completions,
    openai_responses,
    ollama_chat,
    ollama_generate,
    openai_api,
    ollama_api,
)


def build_seat(
    settings: SeatSettings, loader: Loader | None = None, tracer_provider: TracerProvider | None = None
) -> tuple[Seat, list[str]]:
    """The seat's shared state and the names to preload. ``loader`` replaces the real one (tests);
    ``tracer_provider`` turns tracing on (None: off)."""
    metrics = SeatMetrics()
    registry = seat_registry(settings.models, settings.registry, settings.engine)
    budget = None if settings.budget_mb is None else int(settings.budget_mb * MB)
    host = ModelHost(
        registry,
        # the seat's engine faults (none unless a negative control asks: faults.py)
        with_engine_faults(
            loader or make_loader(settings.device, CoreLease(), metrics.observe_loop), settings.faults
        ),
        budget_bytes=budget,
        keep_alive_s=settings.keep_alive_s,
        on_event=metrics.observe_event,
    )
    dlq = seat_dead_letters(settings)  # with the faults a negative control asks for (faults.py)
    tracer = None if tracer_provider is None else SeatTracer(tracer_provider)
    seat = Seat(settings, host, metrics, dlq, started=time.time(), tracer=tracer)
    return seat, preload_names(settings.models, registry, settings.registry is not None)


def preload_models(app: FastAPI) -> list[str]:
    """Load the ``--model`` models now (blocking; typed engine errors propagate); returns their names."""
    seat: Seat = app.state.seat
    for name in app.state.preload:
        seat.host.acquire(name)
        seat.host.release(name)
    return list(app.state.preload)


def create_app(
    settings: SeatSettings,
    loader: Loader | None = None,
    preload: bool = True,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """The seat's ASGI app. With ``preload``, the ``--model`` models load when the lifespan starts;
    without, call ``preload_models(app)`` first (the CLI does, to report load errors as one line).
    With a ``tracer_provider`` (tracing.provider_from_env) every generation request is traced; the app
    shuts the provider down (flushing its spans) when its lifespan ends."""
    seat, names = build_seat(settings, loader, tracer_provider)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(default_pool())  # to_thread's threads end when idle
        if preload:
            await asyncio.to_thread(preload_models, app)
        reaper = asyncio.create_task(_reap(seat.host))
        try:
            yield
        finally:
            reaper.cancel()
            await asyncio.gather(reaper, return_exceptions=True)
            await asyncio.to_thread(seat.host.close)
            seat.acquirer.shutdown(wait=False, cancel_futures=True)
            if seat.tracer is not None:
                await asyncio.to_thread(seat.tracer.shutdown)

    app = FastAPI(title="nxctl seat", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.seat = seat
    app.state.preload = names
    for api in API_MODULES:
        app.include_router(api.router)
    _add_routes(app)
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ApiKey, key=settings.api_key)
    app.add_middleware(Drain, state=seat.drain)
    app.add_middleware(RequestLog, enabled=settings.log_requests)
    if seat.tracer is not None:
        app.add_middleware(TraceRequests, tracer=seat.tracer)
    if settings.cors_origins:  # outermost: a browser's preflight is answered before the API key is asked
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["authorization", "content-type", "x-request-id"],
        )
    return app


async def _reap(host: ModelHost) -> None:
    """Unload idle models whose keep_alive has run out."""
    while True:
        await asyncio.sleep(REAP_INTERVAL_S)
        try:
            await asyncio.to_thread(host.expire)
        except Exception:  # noqa: BLE001 - the reaper must outlive one failed unload
            log.exception("keep_alive expiry failed")


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        seat = seat_of(request)
        return {
            "status": "ok",
            "models": [r.model.name for r in seat.host.resident()],
            "serves": seat.host.names,
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(seat_of(request).metrics.render(), media_type=CONTENT_TYPE)


def _json_error(request: Request, err: APIError) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, err), status_code=err.status, headers=err.headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> Response:
        note(request, error=err.message)
        if err.dead_letter:
            dead_letter(request, err.status, err.message)
        return _json_error(request, err)

    @app.exception_handler(NxError)
    async def on_engine_error(request: Request, exc: NxError) -> Response:
        return await on_api_error(request, from_engine(exc))

    @app.exception_handler(BodyTooLarge)
    async def on_too_large(request: Request, exc: BodyTooLarge) -> Response:
        return _json_error(request, exc.error)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed here"}
        err = APIError(exc.status_code, message.get(exc.status_code, str(exc.detail)))
        return _json_error(request, err)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        return _json_error(request, bad_request(f"invalid request: {exc.errors()[:3]}"))

    @app.exception_handler(Exception)
    async def on_internal(request: Request, exc: Exception) -> Response:
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}", dead_letter=True)
        return await on_api_error(request, err)
