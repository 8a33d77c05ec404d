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
from typing import Any

from engine import testing
from engine.drive import Arrival, drive
from engine.llm import LLM
from engine.llm_engine import Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import INPUT_WEIGHT, OUTPUT_WEIGHT
from gates.framework import Gate, GateRun
from gates.runs import any_differ, run_solo, same

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
    snap = engine.snapshot()
    run.check(
        "share.prefix_hits",
        snap.prefix_hits == expected_hits,
        f"{expected_hits} block hits",
        f"{snap.prefix_hits} hits of {snap.prefix_queries} queried",
        "every later prompt reuses the 4 blocks of the shared prefix",
    )
    # negative control: blocks keyed on their own tokens collide when equal blocks sit at different places
    z, x = _tokens(rng, BLOCK), _tokens(rng, BLOCK)
    victim, other = z + z + _tokens(rng, 5), x + z + _tokens(rng, 5)
    uncached_victim = run_solo(
        LLM(MODEL, num_kv_blocks=64, enable_prefix_caching=False).engine, victim, GREEDY
    )
    honest_engine = LLM(MODEL, num_kv_blocks=64).engine
    run_solo(honest_engine, other, GREEDY)
    honest = run_solo(honest_engine, victim, GREEDY)
    broken_engine = LLM(MODEL, num_kv_blocks=64).engine
    with testing.last_block_prefix_key(broken_engine):
        run_solo(broken_engine, other, GREEDY)
        observed = run_solo(broken_engine, victim, GREEDY)
    run.negative(
        "share.neg.last_block_key",
        any_differ,
        broken=([uncached_victim], [observed]),
        honest=([uncached_victim], [honest]),
        observed="cached output differs from uncached"
        if not same(observed, uncached_victim)
        else "identical",
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
    arrivals = [Arrival(p, long_params, priority=1) for p in slow]
    arrivals.append(Arrival(urgent_prompt, GREEDY, at=5, priority=0))
    result = drive(engine, arrivals)
    ids, urgent, finals = result.ids[:-1], result.ids[-1], result.finals
    order = list(finals)  # in the order they finished
    preemptions = engine.counters.preemptions
    first = order[0] == urgent
    unchanged = same(finals[urgent], solo_urgent) and all(
        same(finals[i], s) for i, s in zip(ids, solo_slow, strict=True)
    )
    run.check(
        "share.priority",
        first and unchanged and preemptions > 0,
        "urgent request finishes first; every output unchanged",
        f"finished position {order.index(urgent) + 1}/5, outputs {'unchanged' if unchanged else 'CHANGED'}, "
        f"{preemptions} preemptions",
        "batch full (max_num_seqs 4) of priority-1 requests",
    )


def _fairness_run(engine: Engine, light_count: int, heavy_count: int) -> tuple[dict[str, float], bool]:
    """Weighted tokens served per tenant until the light tenant's backlog empties; whether every light
    request got all it asked."""
    rng = random.Random(21)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    tenants: list[str] = []
    for i in range(heavy_count + light_count):
        is_light = i % (heavy_count // light_count + 1) == 0 and tenants.count("light") < light_count
        tenants.append("light" if is_light else "heavy")
    ids = [engine.add_request(_tokens(rng, 8), params, tenant=t) for t in tenants]
    tenant_of = dict(zip(ids, tenants, strict=True))
    light_left = {i for i, t in tenant_of.items() if t == "light"}
    served = {"heavy": 0.0, "light": 0.0}
    seen: dict[str, int] = {}

    def account(out: RequestOutput) -> None:
        new = len(out.token_ids) - seen.get(out.request_id, 0)
        seen[out.request_id] = len(out.token_ids)
        prompt = len(out.prompt_token_ids) if new and len(out.token_ids) == new else 0
        if light_left:
            served[tenant_of[out.request_id]] += OUTPUT_WEIGHT * new + INPUT_WEIGHT * prompt
        if out.finished:
            light_left.discard(out.request_id)

    finals = drive(engine, on_output=account).finals
    light_done = all(finals[i].finish_reason == "length" for i, t in tenant_of.items() if t == "light")
    return served, light_done


def _fair_ok(served: dict[str, float]) -> bool:
    total = sum(served.values())
    return total > 0 and all(abs(v / total - 0.5) <= 0.5 * FAIR_TOLERANCE for v in served.values())


def _unfair(served: dict[str, float]) -> bool:
    """The fairness detector: some backlogged tenant is outside its share's tolerance."""
    return not _fair_ok(served)


def _fairness_checks(run: GateRun) -> None:
    settings: dict[str, Any] = {"num_kv_blocks": 256, "max_num_seqs": 4}
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
        _unfair,
        broken=fcfs_served,
        honest=served,
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
