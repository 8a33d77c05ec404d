"""Continuous batching: admission mid-flight, chunked prefill, preemption, abort, failures, accounting."""

from __future__ import annotations

import random

from engine import testing
from engine.drive import drive
from engine.llm import LLM
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def _solo(llm: LLM, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return llm.generate([prompt], params)[0].token_ids


def _drain(engine) -> dict:
    return drive(engine).finals


def test_admission_mid_flight_joins_running_batch() -> None:
    llm = LLM("tiny", num_kv_blocks=64)
    engine = llm.engine
    first = engine.add_request([7, 8, 9], GREEDY)
    for _ in range(3):
        engine.step()
    second = engine.add_request([10, 11], GREEDY)
    outs = engine.step()
    assert {o.request_id for o in outs} == {first, second}  # one forward advanced both
    finals = _drain(engine)
    assert finals[first].token_ids == _solo(llm, [7, 8, 9])
    assert finals[second].token_ids == _solo(llm, [10, 11])


def test_chunked_prefill_spans_steps_and_mixes_with_decodes() -> None:
    llm = LLM("tiny", num_kv_blocks=64, prefill_chunk=32, max_num_batched_tokens=64)
    engine = llm.engine
    short = engine.add_request([5, 6], GREEDY)
    engine.step()
    long_prompt = list(range(3, 203))
    long_id = engine.add_request(long_prompt, GREEDY)
    steps_until_first_token = 0
    while not engine.snapshot().requests[long_id].num_output_tokens:
        engine.step()
        steps_until_first_token += 1
    assert steps_until_first_token >= 200 // 32
    assert engine.counters.mixed_steps > 0
    finals = _drain(engine)
    assert finals[long_id].token_ids == _solo(llm, long_prompt)
    assert finals[short].token_ids == _solo(llm, [5, 6])


def test_preemption_and_resume_keep_outputs() -> None:
    llm = LLM("tiny", num_kv_blocks=12, max_num_seqs=8, enable_prefix_caching=False)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(40)] for _ in range(5)]
    solo = [_solo(llm, p, SamplingParams(max_tokens=30, ignore_eos=True)) for p in prompts]
    outs = llm.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    snap = llm.engine.snapshot()
    assert snap.counters.preemptions > 0
    assert [o.token_ids for o in outs] == solo
    assert snap.kv_blocks_used == 0


def test_abort_frees_blocks() -> None:
    llm = LLM("tiny", num_kv_blocks=32)
    engine = llm.engine
    rid = engine.add_request(list(range(3, 60)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.snapshot().kv_blocks_used > 0
    out = engine.abort(rid)
    assert out is not None and out.finish_reason == "abort"
    assert engine.snapshot().kv_blocks_used == 0
    assert not engine.has_unfinished()


def test_failing_request_beside_healthy_ones() -> None:
    llm = LLM("tiny", num_kv_blocks=64)
    engine = llm.engine
    ok_id = engine.add_request([4, 5, 6], GREEDY)
    bad_id = engine.add_request([7, 8, 9], GREEDY)
    with testing.fail_requests(engine, bad_id):
        finals = _drain(engine)
    assert finals[bad_id].finish_reason == "error" and "injected" in finals[bad_id].error
    assert finals[ok_id].finish_reason == "length"
    assert finals[ok_id].token_ids == _solo(llm, [4, 5, 6])
    assert engine.snapshot().kv_blocks_used == 0


def test_block_accounting_matches_tokens() -> None:
    llm = LLM("tiny", num_kv_blocks=64, enable_prefix_caching=False)
    engine = llm.engine
    rid = engine.add_request(list(range(3, 40)), SamplingParams(max_tokens=20, ignore_eos=True))
    drive(engine, until=lambda: engine.snapshot().requests[rid].num_computed_tokens >= 37)
    snap = engine.snapshot()
    view = snap.requests[rid]
    assert view.num_blocks == -(-view.num_computed_tokens // 16)
    assert snap.kv_blocks_used == view.num_blocks
    _drain(engine)
    assert engine.snapshot().kv_blocks_used == 0


def test_max_num_seqs_caps_the_batch() -> None:
    llm = LLM("tiny", num_kv_blocks=64, max_num_seqs=2)
    engine = llm.engine
    for i in range(5):
        engine.add_request([3 + i, 4, 5], GREEDY)
    engine.step()
    assert len(engine.snapshot().running) == 2
    _drain(engine)
    assert engine.counters.max_requests_in_step == 2
