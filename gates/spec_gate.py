"""Gate `spec`: speculative decoding changes no bit of any output.

Requests run in one continuous batch on an engine that speculates (n-gram prompt lookup, and a draft
model: the target's own first layer) and each is compared, token ids and logprob bits, with its solo
run on the same model without speculation: greedy and seeded sampling side by side, short and long,
some prompts repeating themselves (so proposals are accepted, rejected and cut by max_tokens), a KV
pool small enough to preempt and prompts sharing a prefix (cache hits). On the random-weight `tiny`,
and on `smollm2` for n-gram speculation over text. Checks that speculation really ran (proposals
verified, some accepted), else the equality would say nothing: on `tiny`, n-gram speculation takes
further draws of requests (each checked alike) until that holds. Negative controls, through documented
fault hooks: a verifier that accepts a proposal the target drew differently, and a KV rollback that
keeps a rejected position; each must be caught as a difference. Cases derive from the gate seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from engine import testing
from engine.llm import LLM
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from gates.framework import Gate, GateRun
from gates.runs import any_differ, differing, run_solo, run_together
from gates.seed import gate_seed

Case = tuple[list[int], SamplingParams]
SMALL_POOL: dict[str, Any] = {"num_kv_blocks": 24, "block_size": 4, "prefill_chunk": 8}  # preempts


def _draw(rng: random.Random, vocab: int, n: int, low: int) -> list[Case]:
    """``n`` requests: a shared prefix for half of them, a repeated segment for most (so the n-gram
    proposer finds matches), greedy or seeded sampling with assorted filters and penalties."""
    shared = [rng.randrange(low, vocab) for _ in range(12)]
    cases = []
    for i in range(n):
        segment = [rng.randrange(low, vocab) for _ in range(rng.randint(2, 6))]
        prompt = (shared if i % 2 else []) + segment * rng.randint(1, 4) + [rng.randrange(low, vocab)]
        temperature = rng.choice([0.0, 0.0, 0.6, 1.0])
        params = SamplingParams(
            max_tokens=rng.randint(8, 40),
            temperature=temperature,
            top_p=rng.choice([1.0, 0.9]),
            top_k=rng.choice([0, 20]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.2]),
            seed=rng.randrange(2**31),
            logprobs=rng.choice([0, 2]),
        )
        cases.append((prompt, params))
    return cases


@dataclass
class SpeculationTally:
    """What a speculating engine's batches showed: cases, outputs unequal to their solo runs, and its
    speculation counters over those batches."""

    cases: int = 0
    differ: int = 0
    batches: int = 0
    drafts: int = 0
    accepted: int = 0
    proposed: int = 0
    preemptions: int = 0

    def add(self, spec: LLM, solos: list[RequestOutput], cases: list[Case]) -> list[RequestOutput]:
        """One batch of ``cases`` together on ``spec``, compared with ``solos``; its outputs."""
        before = spec.engine.counters
        outs = run_together(spec.engine, cases)
        after = spec.engine.counters
        self.cases += len(cases)
        self.differ += len(differing(solos, outs))
        self.batches += 1
        self.drafts += after.spec_drafts - before.spec_drafts
        self.accepted += after.spec_accepted_tokens - before.spec_accepted_tokens
        self.proposed += after.spec_draft_tokens - before.spec_draft_tokens
        self.preemptions += after.preemptions - before.preemptions
        return outs

    @property
    def covered(self) -> bool:
        """Speculation really ran: proposals verified, some accepted and some rejected."""
        return self.drafts > 0 and 0 < self.accepted < self.proposed

    def report(self, run: GateRun, check: str, detail: str) -> None:
        run.check(
            check,
            self.differ == 0 and self.covered,
            "every output's tokens and logprob bits equal its solo run without speculation; proposals both accepted and rejected",
            f"{self.differ}/{self.cases} differ ({self.batches} batches); {self.drafts} rounds, "
            f"{self.accepted}/{self.proposed} proposed tokens accepted, {self.preemptions} preemptions",
            detail,
        )


def _equal_check(
    run: GateRun, check: str, spec: LLM, solos: list[RequestOutput], cases: list[Case], detail: str
) -> list[RequestOutput]:
    tally = SpeculationTally()
    outs = tally.add(spec, solos, cases)
    tally.report(run, check, detail)
    return outs


# On the random-weight model, n-gram proposals need its own tokens to repeat a span of the prompt or
# output: some draws of 16 requests propose nothing (about 1 in 15 seeds). Further draws, each checked
# for equality like the first, until the batches have both accepted and rejected proposals.
NGRAM_MAX_BATCHES = 4


def _ngram_check(run: GateRun, seed: int, plain: LLM, cases: list[Case], solos: list[RequestOutput]) -> None:
    ngram = LLM("tiny", speculative="ngram", num_speculative_tokens=4, spec_max_batch=16, **SMALL_POOL)
    tally = SpeculationTally()
    tally.add(ngram, solos, cases)
    rng = random.Random(f"{seed}:spec:ngram")  # its own stream: the later checks' draws stay as they were
    while not tally.covered and tally.batches < NGRAM_MAX_BATCHES:
        more = _draw(rng, plain.model_config.vocab_size, len(cases), 3)
        tally.add(ngram, [run_solo(plain.engine, p, sp) for p, sp in more], more)
    tally.report(
        run,
        "spec.ngram_equal",
        f"seed {seed}; tiny, n-gram, K=4, batches of 16 requests (all may speculate; up to {NGRAM_MAX_BATCHES} "
        "draws until proposals are both accepted and rejected), a pool of 24 blocks of 4",
    )


def _body(run: GateRun) -> None:
    seed = gate_seed()
    rng = random.Random(f"{seed}:spec")
    plain = LLM("tiny", **SMALL_POOL)
    cases = _draw(rng, plain.model_config.vocab_size, 16, 3)
    solos = [run_solo(plain.engine, p, sp) for p, sp in cases]
    _ngram_check(run, seed, plain, cases, solos)
    draft = LLM(
        "tiny",
        speculative="draft",
        draft_model="layers:1",
        num_speculative_tokens=5,
        spec_max_batch=16,
        **SMALL_POOL,
    )
    honest = _equal_check(
        run,
        "spec.draft_equal",
        draft,
        solos,
        cases,
        f"seed {seed}; tiny, draft = its first layer, K=5, 16 requests in one batch",
    )
    run.check(
        "spec.preempt_prefix",
        draft.engine.counters.preemptions > 0 and draft.engine.snapshot().prefix_hits > 0,
        "the speculating batch was preempted and hit the prefix cache",
        f"{draft.engine.counters.preemptions} preemptions, {draft.engine.snapshot().prefix_hits} prefix-cache block hits",
        "what the equality above covered",
    )
    for check, fault in (
        ("spec.neg.accept_wrong", testing.spec_accept_wrong),
        ("spec.neg.keep_rejected_kv", testing.spec_keep_rejected_kv),
    ):
        with fault(draft.engine):
            broken = run_together(draft.engine, cases)
        run.negative(
            check,
            any_differ,
            broken=(solos, broken),
            honest=(solos, honest),
            observed=f"{len(differing(solos, broken))}/{len(cases)} differ with the fault",
            detail="the same requests on the draft engine with the verifier fault switched on",
        )
    _smollm2(run, rng, seed)


def _smollm2(run: GateRun, rng: random.Random, seed: int) -> None:
    """n-gram speculation on real text: prompts that ask the model to repeat a passage, greedy and sampled."""
    plain = LLM("smollm2", num_kv_blocks=128)
    spec = LLM("smollm2", num_kv_blocks=128, speculative="ngram", num_speculative_tokens=6)
    text = (
        "The river rises in the hills, runs past the mill and the old stone bridge, and reaches the sea "
        "at the harbour town, where the boats unload their catch every morning."
    )
    asks = ["Repeat this sentence word for word: ", "Copy the following text exactly: ", "Rewrite this: "]
    cases = []
    for i, ask in enumerate(asks + asks[:1]):
        ids = plain.tokenizer.encode_chat(
            [{"role": "user", "content": ask + text}], add_generation_prompt=True
        )
        temperature = 0.0 if i % 2 == 0 else 0.7
        cases.append(
            (
                ids,
                SamplingParams(max_tokens=40, temperature=temperature, seed=rng.randrange(2**31), logprobs=1),
            )
        )
    solos = [run_solo(plain.engine, p, sp) for p, sp in cases]
    _equal_check(
        run,
        "spec.smollm2_equal",
        spec,
        solos,
        cases,
        f"seed {seed}; smollm2, n-gram, K=6, 4 requests in one batch, greedy and sampled",
    )


GATE = Gate(
    name="spec",
    summary="speculative decoding: every output equal to its run without speculation, bit for bit",
    checks=(
        "spec.ngram_equal",
        "spec.draft_equal",
        "spec.preempt_prefix",
        "spec.neg.accept_wrong",
        "spec.neg.keep_rejected_kv",
        "spec.smollm2_equal",
    ),
    body=_body,
)
