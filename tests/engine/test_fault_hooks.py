"""Fault hooks (engine/testing.py): switched off they cost one look per step, switched on they fire."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from engine import testing
from engine.llm import LLM
from engine.llm_engine import Engine
from engine.models.llama import Faults
from engine.sampling_params import SamplingParams
from engine.speculative.verifier import VerifyFaults
from engine.structured.grammar import Grammar

PARAMS = [
    SamplingParams(max_tokens=16, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=0.8, seed=5, grammar=Grammar.regex("[a-z ]{12,40}")),
    SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.7, seed=3),
    SamplingParams(max_tokens=16, ignore_eos=True),
]
PROMPT = "the cat sat on the mat and the cat sat on the mat and the cat"


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every attribute read of any Faults or VerifyFaults object while the test runs, by name."""
    counted: Counter[str] = Counter()
    for cls in (Faults, VerifyFaults):
        original = cls.__getattribute__

        def counting(self: Any, name: str, original: Any = original, cls: type = cls) -> Any:
            counted[f"{cls.__name__}.{name}"] += 1
            return original(self, name)

        monkeypatch.setattr(cls, "__getattribute__", counting)
    return counted


def _run(engine: Engine, prompt: list[int], params: list[SamplingParams]) -> tuple[int, int]:
    """Run the requests to the end, one step at a time: (steps, tokens generated)."""
    for p in params:
        engine.add_request(prompt, p)
    steps, before = 0, engine.counters.tokens_generated
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps, engine.counters.tokens_generated - before


def test_switched_off_hooks_are_looked_at_once_per_step_not_per_token(reads: Counter[str]) -> None:
    """One request, then four (one constrained, all speculating): the fault switches are read the same
    number of times per step, ``active`` once per step, the verifier's faults never."""
    llm = LLM("tiny", num_kv_blocks=128, speculative="ngram", num_speculative_tokens=4)
    prompt = llm.tokenizer.encode(PROMPT)
    llm.generate([prompt], PARAMS[:1])  # built and warm before counting
    per_step = []
    for params in (PARAMS[:1], PARAMS):
        reads.clear()
        steps, tokens = _run(llm.engine, prompt, params)
        assert reads["Faults.active"] == steps
        assert not any(name.startswith("VerifyFaults.") for name in reads)
        per_step.append((sum(reads.values()) / steps, reads["Faults.fail_requests"] / steps))
    assert tokens > steps  # several tokens a step: a per-token look would show
    assert llm.engine.counters.spec_drafts > 0  # the verify path ran
    assert per_step[0] == per_step[1]


def test_fail_requests_fires_on_the_speculative_path() -> None:
    """The named request fails when it samples, verified or not; the others match their plain runs."""
    spec = LLM("tiny", num_kv_blocks=128, speculative="ngram", num_speculative_tokens=4)
    plain = LLM("tiny", num_kv_blocks=128)
    prompt = spec.tokenizer.encode(PROMPT)
    ids = [spec.engine.add_request(prompt, p) for p in PARAMS]
    with testing.fail_requests(spec.engine, ids[0]):
        finals = {}
        while spec.engine.has_unfinished():
            for out in spec.engine.step():
                if out.finish_reason is not None:
                    finals[out.request_id] = out
    assert finals[ids[0]].finish_reason == "error" and "injected" in (finals[ids[0]].error or "")
    expected = plain.generate([prompt] * 3, PARAMS[1:])
    assert [finals[i].token_ids for i in ids[1:]] == [out.token_ids for out in expected]
    assert spec.engine.counters.spec_drafts > 0
    assert spec.generate([prompt], PARAMS[:1])[0].finish_reason == "length"  # undone on exit
