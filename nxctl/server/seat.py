"""The seat's shared state (``app.state.seat``): its settings, model host, metrics, dead-letter store,
tracer, and the leases each request takes on a model (request_context.seat_of finds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
