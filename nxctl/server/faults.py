"""Documented fault hooks of the seat, for negative controls (``nxctl sched soak --negative-control``).

Each breaks one promise of the seat on purpose, so that a check that should catch it can be shown to.
They are chosen by ``SeatSettings.faults`` (``nxctl serve --fault NAME``, a hidden, testing-only option)
and applied once, when the seat is built (app.build_seat): the request path's own code never tests them.

- ``drop-dead-letters``: the dead-letter store takes every record and keeps none, as a DLQ whose writes
  are silently lost would. Failures are still answered 5xx; no row is left to prove them.
"""

from __future__ import annotations

from collections.abc import Sequence

from nxctl.server.dlq import DeadLetterStore

SEAT_FAULTS = ("drop-dead-letters",)


class DroppingStore(DeadLetterStore):
    """A dead-letter store whose writes are lost: ``record`` returns 0 and stores nothing."""

    def record(
        self, *, method: str, path: str, status: int, reason: str, model: str | None, body: bytes | None
    ) -> int:
        """Keep nothing (the fault)."""
        return 0


def apply_faults(dlq: DeadLetterStore | None, faults: Sequence[str]) -> DeadLetterStore | None:
    """The seat's dead-letter store with ``faults`` applied (unchanged when none are)."""
    if "drop-dead-letters" in faults and dlq is not None:
        return DroppingStore(dlq.path, dlq.max_rows, dlq.redact)
    return dlq
