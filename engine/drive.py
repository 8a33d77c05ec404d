"""drive(): the one loop that steps an Engine until its work is done.

Every caller that runs requests to completion (LLM.generate, the gates, ``nxctl run``, the bench,
the tests) goes through here instead of writing its own ``while has_unfinished(): step()``.

Arrivals join the engine before a given step (``clock="steps"``: deterministic, for gates and tests)
or at a given time after the drive starts (``clock="wall"``: the bench's arrival process). When the
engine is idle and the next arrival is in the future, a step clock jumps to it and a wall clock sleeps
until it. Finished requests are released from the engine as they finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import Engine

Clock = Literal["steps", "wall"]


@dataclass(frozen=True)
class Arrival:
    """A request to add during a drive: before step ``at`` (steps clock) or ``at`` seconds in (wall)."""

    prompt_token_ids: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    at: float = 0.0
    request_id: str | None = None
    priority: int = 0
    tenant: str | None = None


@dataclass
class DriveResult:
    """``ids[i]`` is the request id arrival i got ("" if ``until`` ended the drive before it arrived);
    ``finals`` every request that finished during the drive; ``steps`` the forwards it ran."""

    ids: list[str]
    finals: dict[str, RequestOutput]
    steps: int = 0
    start: float = 0.0  # perf_counter() when the drive began (the wall clock's origin)
    tick: int = 0  # the step clock: forwards run plus idle stretches skipped

    def outputs(self) -> list[RequestOutput]:
        """The final output of each arrival, in arrival order (every one must have finished)."""
        return [self.finals[i] for i in self.ids]


def drive(
    engine: Engine,
    arrivals: Sequence[Arrival] = (),
    *,
    clock: Clock = "steps",
    until: Callable[[], bool] | None = None,
    on_output: Callable[[RequestOutput], None] | None = None,
) -> DriveResult:
    """Add ``arrivals`` on time and step until every request is done, or until ``until()`` is true
    (checked before each step). ``on_output`` sees every output of every step (streaming, progress,
    accounting). Mutates the engine; raises what ``add_request`` raises."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].at)
    result = DriveResult([""] * len(arrivals), {}, start=time.perf_counter())
    pending = list(order)
    while pending or engine.has_unfinished():
        now = _now(clock, result)
        while pending and arrivals[pending[0]].at <= now:
            i = pending.pop(0)
            a = arrivals[i]
            result.ids[i] = engine.add_request(
                a.prompt_token_ids, a.params, a.request_id, a.priority, a.tenant
            )
        if until is not None and until():
            break
        if not engine.has_unfinished():
            _skip_to(clock, result, arrivals[pending[0]].at)
            continue
        for out in engine.step():
            if on_output is not None:
                on_output(out)
            if out.finished:
                result.finals[out.request_id] = out
                engine.release_finished(out.request_id)
        result.steps += 1
        result.tick += 1
    return result


def _now(clock: Clock, result: DriveResult) -> float:
    return float(result.tick) if clock == "steps" else time.perf_counter() - result.start


def _skip_to(clock: Clock, result: DriveResult, at: float) -> None:
    """The engine is idle until the next arrival: jump the step clock, or sleep on the wall clock."""
    if clock == "steps":
        result.tick = max(result.tick, int(-(-at // 1)))
    else:
        time.sleep(max(0.0, result.start + at - time.perf_counter()))
