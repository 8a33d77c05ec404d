"""The runs the engine gates compare, all through engine.drive, and what "identical" means.

A solo run is one request alone in an engine; a scheduled run adds a workload's requests on their
arrival steps and lets the scheduler batch, chunk, preempt and share prefixes as it will. Batch
invariance: every request's scheduled output equals its solo output, bit for bit.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from engine.drive import Arrival, drive
from engine.llm_engine import Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.workload import WorkloadRequest


def run_solo(engine: Engine, prompt: Sequence[int], params: SamplingParams) -> RequestOutput:
    """``prompt`` alone in ``engine`` (which must be idle), run to completion."""
    return drive(engine, [Arrival(prompt, params)]).outputs()[0]


def run_solos(engine: Engine, work: Sequence[WorkloadRequest]) -> list[RequestOutput]:
    """Each request of ``work`` alone, one after another."""
    return [run_solo(engine, r.prompt_token_ids, r.params) for r in work]


def run_together(
    engine: Engine, cases: Sequence[tuple[Sequence[int], SamplingParams]]
) -> list[RequestOutput]:
    """Every (prompt, params) added at once, in one continuous batch; outputs in case order."""
    return drive(engine, [Arrival(prompt, params) for prompt, params in cases]).outputs()


def run_schedule(engine: Engine, work: Sequence[WorkloadRequest]) -> list[RequestOutput]:
    """Every request added before its arrival step, stepped until all finish; outputs in workload order."""
    return drive(engine, [r.arrival() for r in work], clock="steps").outputs()


def same(a: RequestOutput, b: RequestOutput) -> bool:
    """Identical token ids, logprob bits and text."""
    return a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.text == b.text


def differing(expected: Sequence[RequestOutput], observed: Sequence[RequestOutput]) -> list[int]:
    """Indices where ``observed`` is not identical to ``expected``: the invariance detector."""
    return [i for i, (a, b) in enumerate(zip(expected, observed, strict=True)) if not same(a, b)]


def any_differ(pair: tuple[Sequence[RequestOutput], Sequence[RequestOutput]]) -> bool:
    """The invariance detector as a negative control uses it: some output of the pair differs."""
    return bool(differing(*pair))


def digest(outputs: Sequence[RequestOutput]) -> str:
    """sha256 over every output's token ids and the bits of its logprobs (12 hex digits)."""
    h = hashlib.sha256()
    for out in outputs:
        h.update(struct.pack(f"{len(out.token_ids)}q", *out.token_ids))
        h.update(struct.pack(f"{len(out.logprobs)}f", *out.logprobs))
    return h.hexdigest()[:12]
