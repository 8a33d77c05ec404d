"""Gate `sched`: continuous batching with bit-exact batch invariance.

At least 32 requests (prompts of 1 to 600 tokens, varied output lengths, greedy and seeded
temperature / top-k / top-p sampling) arrive on a random schedule drawn from a seed, with a KV pool
small enough to force preemptions. Every request's token ids and logprobs must equal its solo run,
and no block may be leaked; the same holds in bfloat16 and, on fewer requests, on SmolLM2, whose
weight shapes select their own kernels. Negative controls: the same schedule with a deliberately batch-dependent
matmul (engine/testing.py) must show a difference; a request whose seed changed must differ.
"""

from __future__ import annotations

from typing import Any

from engine import testing
from engine.llm import LLM
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.workload import LengthRange, WorkloadRequest, WorkloadSpec, make_workload
from gates.framework import Gate, GateRun
from gates.runs import any_differ, differing, run_schedule, run_solo, run_solos, same

MODEL = "tiny"
SCHEDULE_SEED = 2024
NUM_REQUESTS = 32
REAL_MODEL = "smollm2"
REAL_MODEL_REQUESTS = 12
ENGINE_SETTINGS: dict[str, Any] = {
    "num_kv_blocks": 72,
    "max_num_seqs": 8,
    "prefill_chunk": 64,
    "max_num_batched_tokens": 160,
}


def sched_workload(vocab: int, context: int, count: int = NUM_REQUESTS) -> list[WorkloadRequest]:
    """Prompts of 1 to 600 tokens (both ends included), 1 to 48 tokens out with mixed seeded sampling,
    arriving over about 120 engine steps."""
    spec = WorkloadSpec(
        num_requests=count,
        input_len=LengthRange(1, 600),
        output_len=LengthRange(1, 48),
        rate=count / 120,
        seed=SCHEDULE_SEED,
        sampling="mixed",
        extremes=True,
        token_floor=3,
    )
    return make_workload(spec, vocab, context)


def _invariance(
    run: GateRun, check_id: str, dtype: str, count: int, model: str = MODEL
) -> tuple[LLM, list[WorkloadRequest], list[RequestOutput], list[RequestOutput]]:
    llm = LLM(model, dtype=dtype, **ENGINE_SETTINGS)
    config = llm.model_config
    work = sched_workload(config.vocab_size, config.max_position_embeddings, count)
    solo = run_solos(llm.engine, work)
    steps_before = llm.engine.counters.steps
    batched = run_schedule(llm.engine, work)
    wrong = differing(solo, batched)
    run.check(
        check_id,
        not wrong,
        "every request == its solo run (token ids, logprob bits, text)",
        f"{len(wrong)}/{len(work)} differ" + (f": {wrong[:5]}" if wrong else ""),
        f"{model} {dtype}, {len(work)} requests, {llm.engine.counters.steps - steps_before} batched steps",
    )
    return llm, work, solo, batched


def _body(run: GateRun) -> None:
    llm, work, solo, batched = _invariance(run, "sched.invariance", "float32", NUM_REQUESTS)
    engine = llm.engine
    snap = engine.snapshot()
    stats = snap.counters
    run.check(
        "sched.no_leak",
        snap.kv_blocks_free == snap.kv_blocks_total,
        snap.kv_blocks_total,
        snap.kv_blocks_free,
        "free KV blocks once every request finished",
    )
    run.check(
        "sched.preemption",
        stats.preemptions > 0,
        "> 0 preemptions",
        stats.preemptions,
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
        broken_solo = run_solos(engine, work[:8])
    differ = len(differing(broken_solo, broken[:8]))
    run.negative(
        "sched.neg.batch_dependent_matmul",
        any_differ,
        broken=(broken_solo, broken[:8]),
        honest=(solo[:8], batched[:8]),
        observed=f"{differ}/8 requests differ from their solo runs",
        detail="same schedule, linears replaced by a batch-dependent matmul",
    )
    sampled = next(i for i, r in enumerate(work) if r.params.temperature > 0)
    params = work[sampled].params
    assert params.seed is not None
    changed = run_solo(
        engine, work[sampled].prompt_token_ids, SamplingParams(**{**params.__dict__, "seed": params.seed + 1})
    )
    again = run_solo(engine, work[sampled].prompt_token_ids, params)
    run.negative(
        "sched.neg.changed_seed",
        any_differ,
        broken=([solo[sampled]], [changed]),
        honest=([solo[sampled]], [again]),
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
