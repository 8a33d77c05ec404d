"""Gate `engine`: the paged forward matches the reference forward on `tiny`; greedy generation repeats.

Negative controls: one weight perturbed (the comparison with the reference must see it) and one KV
block swapped between two requests (their greedy tokens must differ from the reference's).
"""

from __future__ import annotations

import random

import torch

from engine import testing
from engine.drive import Arrival, drive
from engine.llm import LLM
from engine.models.reference import ReferenceLlama
from engine.sampling_params import SamplingParams
from gates.framework import Gate, GateRun

MODEL = "tiny"
LOGIT_TOLERANCE = 1e-4  # max |paged - reference| over last-position logits, float32
PROMPT_LENGTHS = (1, 2, 15, 16, 17, 31, 33, 64, 100, 160, 255, 300)  # crossing 16-token block boundaries
NEW_TOKENS = 12


def _prompts(vocab: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


def _paged_vs_reference(llm: LLM, ref: ReferenceLlama, prompts: list[list[int]]) -> tuple[bool, float, int]:
    """Greedy tokens equal and logits close: (all tokens equal, worst logit gap, prompts differing)."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=1)
    outs = llm.generate(prompts, params)
    worst, differing = 0.0, 0
    for prompt, out in zip(prompts, outs, strict=True):
        cache = ref.new_cache(len(prompt) + NEW_TOKENS)
        logits = ref.forward(prompt, cache)
        expected = []
        for token in out.token_ids:
            expected.append(int(logits[-1].argmax()))
            ref_lp = torch.log_softmax(logits[-1], -1)[token].item()
            worst = max(worst, abs(ref_lp - out.logprobs[len(expected) - 1]))
            logits = ref.forward([token], cache)
        differing += expected != out.token_ids
    return differing == 0 and worst <= LOGIT_TOLERANCE, worst, differing


def _body(run: GateRun) -> None:
    llm = LLM(MODEL, num_kv_blocks=256)
    ref = ReferenceLlama(llm.model_config, _weights(llm), torch.float32, torch.device("cpu"))
    prompts = _prompts(llm.model_config.vocab_size)
    honest = _paged_vs_reference(llm, ref, prompts)
    ok, worst, differing = honest
    run.check(
        "engine.paged_vs_reference",
        ok,
        f"same greedy tokens, logprob gap <= {LOGIT_TOLERANCE}",
        f"{differing} prompts differ, worst gap {worst:.2e}",
        f"{len(prompts)} prompts of {PROMPT_LENGTHS[0]}..{PROMPT_LENGTHS[-1]} tokens, {NEW_TOKENS} tokens each",
    )
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(prompts[:6], params)]
    second = [o.token_ids for o in llm.generate(prompts[:6], params)]
    run.check(
        "engine.greedy_repeat", first == second, "identical", "identical" if first == second else "differ"
    )
    snap = llm.engine.snapshot()
    run.check(
        "engine.blocks_returned",
        snap.kv_blocks_free == snap.kv_blocks_total,
        snap.kv_blocks_total,
        snap.kv_blocks_free,
        "free blocks after every request finished",
    )
    _neg_swapped_block(run, llm, ref, prompts)
    _neg_perturbed_weight(run, ref, prompts, honest)


def _weights(llm: LLM) -> dict[str, torch.Tensor]:
    from engine.loader import load_model

    return load_model(llm.source).dense_weights()


def _disagrees(result: tuple[bool, float, int]) -> bool:
    """The paged-vs-reference detector: tokens or logprobs not as the reference's."""
    return not result[0]


def _neg_perturbed_weight(
    run: GateRun, ref: ReferenceLlama, prompts: list[list[int]], honest: tuple[bool, float, int]
) -> None:
    broken = LLM(MODEL, num_kv_blocks=256)
    testing.perturb_weight(broken.engine, "model.layers.0.mlp.down_proj.weight", delta=0.5)
    result = _paged_vs_reference(broken, ref, prompts)
    _, worst, differing = result
    run.negative(
        "engine.neg.perturbed_weight",
        _disagrees,
        broken=result,
        honest=honest,
        observed=f"{differing} prompts differ, worst gap {worst:.2e}",
        detail="one element of layer 0 down_proj shifted by 0.5",
    )


def _neg_swapped_block(run: GateRun, llm: LLM, ref: ReferenceLlama, prompts: list[list[int]]) -> None:
    engine = llm.engine
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    a, b = prompts[-1], prompts[-2]
    started = drive(
        engine,
        [Arrival(a, params), Arrival(b, params)],
        until=lambda: all(r.prefilled for r in engine.snapshot().requests.values()),
    )
    testing.swap_kv_block(engine, started.ids[0], started.ids[1], block_index=0)
    finals = drive(engine).finals
    expected = [ref.greedy(p, NEW_TOKENS) for p in (a, b)]
    observed = [finals[i].token_ids for i in started.ids]
    # the honest input: the same two requests on an engine no fault has touched (the swapped blocks
    # stay in this engine's prefix cache, so it cannot serve as its own honest run)
    unswapped = [o.token_ids for o in LLM(MODEL, num_kv_blocks=256).generate([a, b], params)]

    def differs(tokens: list[list[int]]) -> bool:
        return tokens != expected

    run.negative(
        "engine.neg.swapped_kv_block",
        differs,
        broken=observed,
        honest=unswapped,
        observed="outputs differ from the reference" if observed != expected else "outputs unchanged",
        detail="block 0 of two running requests exchanged after prefill",
    )


GATE = Gate(
    name="engine",
    summary="paged forward == reference forward on tiny; greedy repeats; blocks returned",
    checks=(
        "engine.paged_vs_reference",
        "engine.greedy_repeat",
        "engine.blocks_returned",
        "engine.neg.perturbed_weight",
        "engine.neg.swapped_kv_block",
    ),
    body=_body,
)
