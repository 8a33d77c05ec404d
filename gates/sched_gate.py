"""Gate `sched`: continuous batching with bit-exact batch invariance.

At least 32 requests (prompts of 1 to 600 tokens, varied output lengths, greedy and seeded
temperature / top-k / top-p sampling) arrive on a random schedule drawn from a seed, with a KV pool
small enough to force preemptions. Every request's token ids and logprobs must equal its solo run,
and no block may be leaked; the same holds in bfloat16 and, on fewer requests, on SmolLM2, whose
weight shapes select their own kernels. Negative controls: the same schedule with a deliberately batch-dependent
matmul (engine/testing.py) must show a difference; a request whose seed changed must differ.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine import testing
from engine.llm_engine import LLM, Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from gates.framework import Gate, GateRun

MODEL = "tiny"
SCHEDULE_SEED = 2024
NUM_REQUESTS = 32
REAL_MODEL = "smollm2"
REAL_MODEL_REQUESTS = 12
ENGINE_SETTINGS = {"num_kv_blocks": 72, "max_num_seqs": 8, "prefill_chunk": 64, "max_num_batched_tokens": 160}


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    params: list[SamplingParams]
    arrival_steps: list[int]  # the engine step before which each request is added


def make_workload(vocab: int, seed: int = SCHEDULE_SEED, count: int = NUM_REQUESTS) -> Workload:
    rng = random.Random(seed)
    lengths = [1, 600] + [rng.randint(1, 600) for _ in range(count - 2)]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
    params = []
    for i in range(count):
        kind = i % 4
        params.append(
            SamplingParams(
                max_tokens=rng.randint(1, 48),
                temperature=0.0 if kind == 0 else rng.choice([0.7, 1.0, 1.3]),
                top_k=rng.choice([0, 5, 40]) if kind in (1, 3) else 0,
                top_p=rng.choice([0.8, 0.95]) if kind in (2, 3) else 1.0,
                seed=rng.randrange(2**31),
                ignore_eos=rng.random() < 0.5,
            )
        )
    arrivals = sorted(rng.randint(0, 120) for _ in range(count))
    rng.shuffle(order := list(range(count)))
    return Workload([prompts[i] for i in order], [params[i] for i in order], arrivals)


def run_solo(engine: Engine, prompt: list[int], params: SamplingParams) -> RequestOutput:
    rid = engine.add_request(prompt, params)
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.finished:
                final = out
    engine.release_finished(rid)
    assert final is not None
    return final


def run_schedule(engine: Engine, work: Workload) -> list[RequestOutput]:
    """Add each request before its drawn step; step until all finish. Outputs in workload order."""
    index: dict[str, int] = {}
    finals: dict[int, RequestOutput] = {}
    step = 0
    pending = list(range(len(work.prompts)))
    while pending or engine.has_unfinished():
        while pending and work.arrival_steps[pending[0]] <= step:
            i = pending.pop(0)
            index[engine.add_request(work.prompts[i], work.params[i])] = i
        for out in engine.step():
            if out.finished:
                finals[index[out.request_id]] = out
                engine.release_finished(out.request_id)
        step += 1
    return [finals[i] for i in range(len(work.prompts))]


def same(a: RequestOutput, b: RequestOutput) -> bool:
    return a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.text == b.text


def _invariance(
    run: GateRun, check_id: str, dtype: str, count: int, model: str = MODEL
) -> tuple[LLM, Workload, list[RequestOutput]]:
    llm = LLM(model, dtype=dtype, **ENGINE_SETTINGS)
    work = make_workload(llm.model_config.vocab_size, count=count)
    solo = [run_solo(llm.engine, p, s) for p, s in zip(work.prompts, work.params, strict=True)]
    stats_before = llm.engine.stats.steps
    batched = run_schedule(llm.engine, work)
    differing = [i for i, (a, b) in enumerate(zip(solo, batched, strict=True)) if not same(a, b)]
    run.check(
        check_id,
        not differing,
        "every request == its solo run (token ids, logprob bits, text)",
        f"{len(differing)}/{len(work.prompts)} differ" + (f": {differing[:5]}" if differing else ""),
        f"{model} {dtype}, {len(work.prompts)} requests, {llm.engine.stats.steps - stats_before} batched steps",
    )
    return llm, work, solo


def _body(run: GateRun) -> None:
    llm, work, solo = _invariance(run, "sched.invariance", "float32", NUM_REQUESTS)
    engine, stats = llm.engine, llm.engine.stats
    run.check(
        "sched.no_leak",
        engine.pool.num_free == engine.pool.num_blocks,
        engine.pool.num_blocks,
        engine.pool.num_free,
        "free KV blocks once every request finished",
    )
    run.check(
        "sched.preemption",
        engine.scheduler.num_preemptions > 0,
        "> 0 preemptions",
        engine.scheduler.num_preemptions,
        f"pool of {ENGINE_SETTINGS['num_kv_blocks']} blocks",
    )
    run.check(
        "sched.continuous_batching",
        stats.joins_mid_flight > 0 and stats.max_requests_in_step > 1,
        "requests join mid-flight; > 1 request per forward",
        f"{stats.joins_mid_flight} joins, up to {stats.max_requests_in_step} requests per step",
    )
    run.check(
        "sched.chunked_prefill",
        stats.chunked_prompts > 0 and stats.mixed_steps > 0,
        "prompts chunked over steps, mixed with decodes",
        f"{stats.chunked_prompts} chunked prompts, {stats.mixed_steps} mixed steps",
    )
    _invariance(run, "sched.invariance_bf16", "bfloat16", 16)
    # the real model's weight shapes pick their own kernels: check them too
    _invariance(run, "sched.invariance_smollm2", "float32", REAL_MODEL_REQUESTS, model=REAL_MODEL)

    with testing.batch_dependent_matmul(engine):
        broken = run_schedule(engine, work)
        broken_solo = [run_solo(engine, p, s) for p, s in zip(work.prompts[:8], work.params[:8], strict=True)]
    differ = sum(not same(a, b) for a, b in zip(broken_solo, broken[:8], strict=True))
    run.negative(
        "sched.neg.batch_dependent_matmul",
        caught=differ > 0,
        observed=f"{differ}/8 requests differ from their solo runs",
        detail="same schedule, linears replaced by a batch-dependent matmul",
    )
    sampled = next(i for i, p in enumerate(work.params) if p.temperature > 0)
    params = work.params[sampled]
    changed = run_solo(
        engine, work.prompts[sampled], SamplingParams(**{**params.__dict__, "seed": params.seed + 1})
    )
    run.negative(
        "sched.neg.changed_seed",
        caught=not same(changed, solo[sampled]),
        observed="output differs" if not same(changed, solo[sampled]) else "output identical",
        detail=f"request {sampled} re-run with seed + 1",
    )


GATE = Gate(
    name="sched",
    summary="continuous batching: every request bit-identical to its solo run, no leaked blocks",
    checks=(
        "sched.invariance",
        "sched.no_leak",
        "sched.preemption",
        "sched.continuous_batching",
        "sched.chunked_prefill",
        "sched.invariance_bf16",
        "sched.invariance_smollm2",
        "sched.neg.batch_dependent_matmul",
        "sched.neg.changed_seed",
    ),
    body=_body,
)
