"""Gate `share`: prefix cache, priorities and fair sharing, without giving up batch invariance.

Checks: cached and uncached outputs identical; the expected hit count on a known trace; a more urgent
request admitted into a full batch finishes before the less urgent ones it overtook (their outputs
unchanged); with two backlogged tenants, one sending 10x the requests of the other, each is served
within 20% of an equal share of weighted tokens while both are backlogged, and a light tenant below
its share gets all it asks. Negative controls: a cache keyed on the last block alone (so equal
blocks collide) must be caught by the cached-vs-uncached check; FCFS must fail the fairness check.
"""

from __future__ import annotations

import random

from engine import testing
from engine.llm_engine import LLM, Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import INPUT_WEIGHT, OUTPUT_WEIGHT
from gates.framework import Gate, GateRun
from gates.sched_gate import run_solo, same

MODEL = "tiny"
BLOCK = 16
FAIR_TOLERANCE = 0.20
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def _sequential(
    engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY
) -> list[RequestOutput]:
    return [run_solo(engine, p, params) for p in prompts]


def _prefix_checks(run: GateRun) -> None:
    rng = random.Random(5)
    system = _tokens(rng, 4 * BLOCK)  # a shared 64-token prefix: 4 full blocks
    prompts = [system + _tokens(rng, rng.randint(3, 40)) for _ in range(6)]
    uncached = _sequential(LLM(MODEL, num_kv_blocks=128, enable_prefix_caching=False).engine, prompts)
    engine = LLM(MODEL, num_kv_blocks=128).engine
    cached = _sequential(engine, prompts)
    differing = sum(not same(a, b) for a, b in zip(uncached, cached, strict=True))
    run.check(
        "share.prefix_identical",
        differing == 0,
        "cached == uncached (tokens, logprob bits)",
        f"{differing}/{len(prompts)} differ",
        "6 prompts sharing a 64-token prefix, one after another",
    )
    expected_hits = (len(prompts) - 1) * 4
    run.check(
        "share.prefix_hits",
        engine.pool.hits == expected_hits,
        f"{expected_hits} block hits",
        f"{engine.pool.hits} hits of {engine.pool.queries} queried",
        "every later prompt reuses the 4 blocks of the shared prefix",
    )
    # negative control: blocks keyed on their own tokens collide when equal blocks sit at different places
    z, x = _tokens(rng, BLOCK), _tokens(rng, BLOCK)
    victim = z + z + _tokens(rng, 5)
    honest = run_solo(LLM(MODEL, num_kv_blocks=64, enable_prefix_caching=False).engine, victim, GREEDY)
    broken_engine = LLM(MODEL, num_kv_blocks=64).engine
    with testing.last_block_prefix_key(broken_engine):
        run_solo(broken_engine, x + z + _tokens(rng, 5), GREEDY)
        observed = run_solo(broken_engine, victim, GREEDY)
    run.negative(
        "share.neg.last_block_key",
        caught=not same(observed, honest),
        observed="cached output differs from uncached" if not same(observed, honest) else "identical",
        detail="cache keyed on a block's own tokens: the victim's block 0 collides with another's block 1",
    )


def _priority_check(run: GateRun) -> None:
    llm = LLM(MODEL, num_kv_blocks=128, max_num_seqs=4)
    engine = llm.engine
    rng = random.Random(9)
    slow = [_tokens(rng, 20) for _ in range(4)]
    long_params = SamplingParams(max_tokens=60, ignore_eos=True)
    solo_slow = [run_solo(engine, p, long_params) for p in slow]
    urgent_prompt = _tokens(rng, 12)
    solo_urgent = run_solo(engine, urgent_prompt, GREEDY)
    ids = [engine.add_request(p, long_params, priority=1) for p in slow]
    for _ in range(5):
        engine.step()
    urgent = engine.add_request(urgent_prompt, GREEDY, priority=0)
    order: list[str] = []
    finals: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                order.append(out.request_id)
                finals[out.request_id] = out
    first = order[0] == urgent
    unchanged = same(finals[urgent], solo_urgent) and all(
        same(finals[i], s) for i, s in zip(ids, solo_slow, strict=True)
    )
    run.check(
        "share.priority",
        first and unchanged and engine.scheduler.num_preemptions > 0,
        "urgent request finishes first; every output unchanged",
        f"finished position {order.index(urgent) + 1}/5, outputs {'unchanged' if unchanged else 'CHANGED'}, "
        f"{engine.scheduler.num_preemptions} preemptions",
        "batch full (max_num_seqs 4) of priority-1 requests",
    )


def _served_while_backlogged(engine: Engine, heavy: list[str], light: list[str]) -> dict[str, float]:
    """Weighted tokens served per tenant until the light tenant's backlog empties."""
    served = {"heavy": 0.0, "light": 0.0}
    tenant_of = {i: "heavy" for i in heavy} | {i: "light" for i in light}
    seen: dict[str, int] = {}
    while any(not engine.requests[i].finished for i in light):
        for out in engine.step():
            new = len(out.token_ids) - seen.get(out.request_id, 0)
            seen[out.request_id] = len(out.token_ids)
            prompt = len(out.prompt_token_ids) if new and len(out.token_ids) == new else 0
            served[tenant_of[out.request_id]] += OUTPUT_WEIGHT * new + INPUT_WEIGHT * prompt
    while engine.has_unfinished():
        engine.step()
    return served


def _fairness_run(engine: Engine, light_count: int, heavy_count: int) -> tuple[dict[str, float], bool]:
    rng = random.Random(21)
    heavy, light = [], []
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for i in range(heavy_count + light_count):
        is_light = i % (heavy_count // light_count + 1) == 0 and len(light) < light_count
        rid = engine.add_request(_tokens(rng, 8), params, tenant="light" if is_light else "heavy")
        (light if is_light else heavy).append(rid)
    served = _served_while_backlogged(engine, heavy, light)
    light_done = all(engine.requests[i].finish_reason == "length" for i in light)
    return served, light_done


def _fair_ok(served: dict[str, float]) -> bool:
    total = sum(served.values())
    return total > 0 and all(abs(v / total - 0.5) <= 0.5 * FAIR_TOLERANCE for v in served.values())


def _fairness_checks(run: GateRun) -> None:
    settings = {"num_kv_blocks": 256, "max_num_seqs": 4}
    served, _ = _fairness_run(LLM(MODEL, **settings).engine, light_count=12, heavy_count=120)
    shares = {k: v / sum(served.values()) for k, v in served.items()}
    light_engine = LLM(MODEL, **settings).engine
    light_served, light_done = _fairness_run(light_engine, light_count=2, heavy_count=120)
    ok = _fair_ok(served) and light_done
    run.check(
        "share.fairness",
        ok,
        f"each backlogged tenant within {FAIR_TOLERANCE:.0%} of 50%; light one served",
        f"heavy {shares['heavy']:.1%}, light {shares['light']:.1%}; 2-request tenant done: {light_done}",
        "VTC counters; heavy tenant sends 10x the requests",
    )
    fcfs_engine = LLM(MODEL, **settings).engine
    with testing.fcfs_scheduling(fcfs_engine):
        fcfs_served, _ = _fairness_run(fcfs_engine, light_count=12, heavy_count=120)
    fcfs_share = fcfs_served["light"] / sum(fcfs_served.values())
    run.negative(
        "share.neg.fcfs",
        caught=not _fair_ok(fcfs_served),
        observed=f"FCFS gives the light tenant {fcfs_share:.1%}",
        detail="same trace, first-come first-served",
    )


def _body(run: GateRun) -> None:
    _prefix_checks(run)
    _priority_check(run)
    _fairness_checks(run)


GATE = Gate(
    name="share",
    summary="prefix cache, priorities and fair sharing keep outputs bit-identical",
    checks=(
        "share.prefix_identical",
        "share.prefix_hits",
        "share.priority",
        "share.fairness",
        "share.neg.last_block_key",
        "share.neg.fcfs",
    ),
    body=_body,
)
