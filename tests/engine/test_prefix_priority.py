"""Prefix cache, priority and tenants through the Engine API."""

from __future__ import annotations

from engine.drive import drive
from engine.llm import LLM
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def test_prefix_cache_reuses_blocks_and_keeps_output() -> None:
    cached = LLM("tiny", num_kv_blocks=64)
    plain = LLM("tiny", num_kv_blocks=64, enable_prefix_caching=False)
    system = list(range(10, 10 + 48))
    prompts = [system + [100 + i, 200 + i] for i in range(3)]
    for prompt in prompts:
        a = cached.generate([prompt], GREEDY)[0]
        b = plain.generate([prompt], GREEDY)[0]
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert cached.engine.snapshot().prefix_hits == 2 * 3
    out = cached.generate([prompts[0]], GREEDY)[0]
    assert out.num_cached_tokens == 48


def test_freed_cached_blocks_are_reused_when_pool_is_short() -> None:
    llm = LLM("tiny", num_kv_blocks=8)
    for i in range(6):
        llm.generate([[3 + i] * 40], GREEDY)
    assert llm.engine.snapshot().kv_blocks_used == 0


def test_urgent_request_overtakes_full_batch() -> None:
    llm = LLM("tiny", num_kv_blocks=64, max_num_seqs=2)
    engine = llm.engine
    slow = [
        engine.add_request([5 + i] * 10, SamplingParams(max_tokens=40, ignore_eos=True), priority=2)
        for i in range(2)
    ]
    engine.step()
    urgent = engine.add_request([9, 9, 9], GREEDY, priority=-1)
    order = list(drive(engine).finals)  # in the order they finished
    assert order[0] == urgent and set(order[1:]) == set(slow)
    assert engine.counters.preemptions >= 1


def test_returning_tenant_is_owed_nothing() -> None:
    llm = LLM("tiny", num_kv_blocks=64, max_num_seqs=1)
    engine = llm.engine
    for _ in range(3):
        engine.add_request([4, 5, 6], GREEDY, tenant="busy")
    drive(engine)
    engine.add_request([4, 5, 6], GREEDY, tenant="busy")
    engine.add_request([4, 5, 6], GREEDY, tenant="newcomer")
    served = engine.snapshot().tenant_service
    assert served["busy"] > 0
    assert served["newcomer"] == served["busy"]  # lifted to the active tenant's count, not owed a backlog
