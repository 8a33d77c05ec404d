"""The seat's shared state (``app.state.seat``) and what each request leaves behind: its log line's
facts and, for a server-side failure, a dead letter."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from nxctl.server.dlq import DeadLetterStore
from nxctl.server.host import ModelHost
from nxctl.server.keep_alive import KeepAlive
from nxctl.server.lease import ModelLease
from nxctl.server.prometheus_metrics import SeatMetrics
from nxctl.server.settings import SeatSettings

log = logging.getLogger("nxctl.serve")


def _acquirer() -> ThreadPoolExecutor:
    """The seat's own pool for lease acquires (they may block on a load or on room)."""
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="nxctl-acquire")


@dataclass
class Seat:
    """Everything the handlers share."""

    settings: SeatSettings
    host: ModelHost
    metrics: SeatMetrics
    dlq: DeadLetterStore | None
    started: float = 0.0  # wall clock
    acquirer: ThreadPoolExecutor = field(default_factory=_acquirer)

    def lease(self, name: str, keep_alive: KeepAlive | None = None) -> ModelLease:
        """A lease on model ``name`` for one request (acquired on the seat's own thread pool)."""
        keep = keep_alive if keep_alive is not None else KeepAlive()
        return ModelLease(self.host, name, keep, self.settings.load_timeout_s, self.acquirer)


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
