"""The seat's shared state (``app.state.seat``) and what each request leaves behind: its log line's
facts and, for a server-side failure, a dead letter."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from nxctl.server.dlq import DeadLetterStore
from nxctl.server.drain import DrainState
from nxctl.server.host import ModelHost
from nxctl.server.idle_pool import POOL_IDLE_S, IdleThreadPool
from nxctl.server.keep_alive import KeepAlive
from nxctl.server.lease import ModelLease
from nxctl.server.prometheus_metrics import SeatMetrics
from nxctl.server.settings import SeatSettings
from nxctl.server.timeline import RequestTimeline

if TYPE_CHECKING:
    from nxctl.server.tracing import SeatTracer

log = logging.getLogger("nxctl.serve")


def _acquirer() -> IdleThreadPool:
    """The seat's own pool for lease acquires (they may block on a load or on room); its threads end
    once idle, so an idle seat holds none."""
    return IdleThreadPool(max_workers=64, idle_s=POOL_IDLE_S, name="nxctl-acquire")


@dataclass
class Seat:
    """Everything the handlers share."""

    settings: SeatSettings
    host: ModelHost
    metrics: SeatMetrics
    dlq: DeadLetterStore | None
    started: float = 0.0  # wall clock
    tracer: SeatTracer | None = None  # None: tracing is off
    acquirer: IdleThreadPool = field(default_factory=_acquirer)
    drain: DrainState = field(default_factory=DrainState)

    def lease(
        self, name: str, keep_alive: KeepAlive | None = None, timeline: RequestTimeline | None = None
    ) -> ModelLease:
        """A lease on model ``name`` for one request (acquired on the seat's own thread pool); a load it
        sets off goes on the request's ``timeline`` when it has one."""
        keep = keep_alive if keep_alive is not None else KeepAlive()
        return ModelLease(self.host, name, keep, self.settings.load_timeout_s, self.acquirer, timeline)


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
