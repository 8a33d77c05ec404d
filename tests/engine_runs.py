"""Run prompts through an Engine to the end and collect what tests compare: tokens and logprob bits."""

from __future__ import annotations

from engine.llm_engine import Engine
from engine.sampling_params import SamplingParams


def run_to_end(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, together: bool = True
) -> list[tuple[list[int], list[float]]]:
    """Each prompt's tokens and logprobs, all in one batch or each alone, in prompt order."""
    groups = [prompts] if together else [[p] for p in prompts]
    results = []
    for group in groups:
        ids = [engine.add_request(p, params) for p in group]
        finals = {}
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = out
        results += [(finals[i].token_ids, finals[i].logprobs) for i in ids]
    return results
