"""Documented fault hooks of the seat, for negative controls (``nxctl sched soak --negative-control``).

Each breaks one promise of the seat on purpose, so that a check that should catch it can be shown to.
They are chosen by ``SeatSettings.faults`` (``nxctl serve --fault NAME``, a hidden, testing-only option)
and applied once, when the seat is built (app.build_seat): the request path's own code never tests them.

- ``drop-dead-letters``: the dead-letter store takes every record and keeps none, as a DLQ whose writes
  are silently lost would. Failures are still answered 5xx; no row is left to prove them.
- ``fail-request:ID``: every engine the seat loads fails the engine request ``ID`` when it samples
  (engine.testing.fail_requests, for the seat's life), as an engine fault would: the serve gate's DLQ
  check drives a seat started as a process with it (a request's engine id is its X-Request-Id and
  ``-N``, its choice index).
- ``route-round-robin``: on Ray Serve (`nxctl serve --ray`), the router ignores each request's model
  and prompt and takes the replicas in turn (ray_router.py), as routing unaware of models would: the
  checks that a model's requests land on its replica and that shared prefixes land together catch it.
- ``replica-exit``: on Ray Serve, a replica ends its own process (as a crash would) in the middle of
  the requests that ask for it by their X-Request-Id: ``exit-K-...`` after K body messages of the
  request's first attempt (K = 0: before any), ``exitall-K-...`` on every attempt. Other requests are
  untouched. The failover tests and the ``cluster`` gate kill replicas this way, at a chosen chunk of a
  stream, never after a sleep.
- ``resume-no-skip``: on Ray Serve, the ingress forwards a stream resumed on another replica whole,
  without skipping what the client already has (failover.py): the checks that a resumed stream equals
  an unbroken one catch the repeated text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.testing import fail_requests
from nxctl.server.dlq import DeadLetterStore

if TYPE_CHECKING:  # the seat's settings read this module: no torch for `nxctl` commands that plan or list
    from nxctl.server.host import SeatModel
    from nxctl.server.settings import SeatSettings

SEAT_FAULTS = ("drop-dead-letters", "route-round-robin", "replica-exit", "resume-no-skip")
FAIL_REQUEST = "fail-request:"


def is_seat_fault(name: str) -> bool:
    """Whether ``name`` is a documented fault (``fail-request:`` needs an id after it)."""
    return name in SEAT_FAULTS or (name.startswith(FAIL_REQUEST) and len(name) > len(FAIL_REQUEST))


def with_engine_faults(loader: Callable[..., SeatModel], faults: Sequence[str]) -> Callable[..., SeatModel]:
    """``loader`` whose engines fail the ``fail-request:`` ids of ``faults`` (unchanged when none)."""
    ids = [f.removeprefix(FAIL_REQUEST) for f in faults if f.startswith(FAIL_REQUEST)]
    if not ids:
        return loader

    held = contextlib.ExitStack()  # never closed: the hooks stay on for the seat's life (the loader holds it)

    def load(*args: object) -> SeatModel:
        model = loader(*args)
        held.enter_context(fail_requests(model.llm.engine, *ids))
        return model

    return load


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


def seat_dead_letters(settings: SeatSettings) -> DeadLetterStore | None:
    """The dead-letter store the settings name (None when off), with their faults applied."""
    from nxctl.server.settings import default_dlq_path

    if not settings.dlq_enabled:
        return None
    path = settings.dlq_path or default_dlq_path()
    return apply_faults(DeadLetterStore(path, settings.dlq_max_rows, settings.dlq_redact), settings.faults)


def replica_exit_after(faults: Sequence[str], request_id: str | None, attempt: int) -> int | None:
    """With the fault ``replica-exit``: after how many body messages the replica answering attempt
    ``attempt`` of the request ``request_id`` ends its process; None when it does not."""
    if "replica-exit" not in faults or not request_id:
        return None
    kind, _, rest = request_id.partition("-")
    count, _, _ = rest.partition("-")
    if not count.isdigit() or kind not in ("exit", "exitall") or (kind == "exit" and attempt > 1):
        return None
    return int(count)
