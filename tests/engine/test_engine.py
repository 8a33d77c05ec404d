"""The paged engine against the reference forward; sampling, seeds, stops, typed errors."""

from __future__ import annotations

import random

import pytest
import torch

from engine.errors import CapacityError, InvalidRequestError
from engine.llm import LLM
from engine.models.reference import ReferenceLlama
from engine.sampling_params import SamplingParams


def _reference(loaded) -> ReferenceLlama:
    return ReferenceLlama(loaded.config, loaded.dense_weights(), torch.float32, torch.device("cpu"))


def test_paged_matches_reference_on_tiny(tiny_llm: LLM, tiny_loaded) -> None:
    ref = _reference(tiny_loaded)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 5, 16, 17, 40, 130, 300)]
    outs = tiny_llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == ref.greedy(prompt, 10)
        cache = ref.new_cache(len(prompt) + 1)
        expected = torch.log_softmax(ref.forward(prompt, cache)[-1], -1)[out.token_ids[0]].item()
        assert abs(out.logprobs[0] - expected) < 1e-4


@pytest.mark.smollm2
def test_paged_matches_reference_on_smollm2(smollm2_loaded) -> None:
    """The paged engine on the shipped GGUF, its weights' float values multiplied as they are (float
    activations: the path the reference computes), greedy like the reference."""
    llm = LLM("smollm2", activations="float", num_kv_blocks=64)
    ref = _reference(smollm2_loaded)
    tok = smollm2_loaded.tokenizer
    prompts = [
        tok.encode_chat([{"role": "user", "content": q}]) for q in ("Name a color.", "What is 2+2? " * 5)
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=12))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == ref.greedy(prompt, 12, tok.stop_token_ids)


@pytest.mark.smollm2
def test_smollm2_knows_paris(smollm2_llm: LLM) -> None:
    # a prompt whose first token has a clear lead (1.4 in logprob over the next): "What is the capital of
    # France?" starts "The" or "L'" 0.01-0.05 apart, a margin that any change of summation order may flip
    out = smollm2_llm.chat(
        [{"role": "user", "content": "Name the capital of France."}], SamplingParams(max_tokens=32)
    )
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


def test_blocks_all_returned(tiny_llm: LLM) -> None:
    tiny_llm.generate(["hello world"] * 5, SamplingParams(max_tokens=20, ignore_eos=True))
    snap = tiny_llm.engine.snapshot()
    assert snap.kv_blocks_used == 0 and snap.kv_blocks_free == snap.kv_blocks_total


def test_seeded_sampling_repeats_and_other_seed_differs(tiny_llm: LLM) -> None:
    params = SamplingParams(max_tokens=30, temperature=1.0, top_k=50, top_p=0.95, seed=11, ignore_eos=True)
    a = tiny_llm.generate("Once upon a time", params)[0]
    b = tiny_llm.generate("Once upon a time", params)[0]
    c = tiny_llm.generate("Once upon a time", SamplingParams(**{**params.__dict__, "seed": 12}))[0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_stop_strings_never_in_text(tiny_llm: LLM) -> None:
    free = tiny_llm.generate("The", SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert len(free.text) > 6
    stop = free.text[3:6]
    out = tiny_llm.generate("The", SamplingParams(max_tokens=40, ignore_eos=True, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert free.text.startswith(out.text)


def test_max_tokens_gives_length(tiny_llm: LLM) -> None:
    out = tiny_llm.generate("abc", SamplingParams(max_tokens=7, ignore_eos=True))[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs",
    [{"max_tokens": 0}, {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}],
)
def test_bad_sampling_params_are_typed(kwargs: dict) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)


def test_prompt_longer_than_context(tiny_llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="context"):
        tiny_llm.engine.add_request([5] * 2000, SamplingParams())


def test_request_too_large_for_pool() -> None:
    llm = LLM("tiny", num_kv_blocks=4)
    with pytest.raises(CapacityError, match="pool"):
        llm.engine.add_request([5] * 60, SamplingParams(max_tokens=10))


def test_generate_takes_one_sampling_params_per_prompt(tiny_llm: LLM) -> None:
    prompts = ["Once upon a time", "The cat"]
    per_prompt = [
        SamplingParams(max_tokens=3, ignore_eos=True),
        SamplingParams(max_tokens=7, temperature=1.0, seed=5, ignore_eos=True),
    ]
    outs = tiny_llm.generate(prompts, per_prompt)
    assert [len(o.token_ids) for o in outs] == [3, 7]
    alone = [tiny_llm.generate(p, sp)[0] for p, sp in zip(prompts, per_prompt, strict=True)]
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    with pytest.raises(InvalidRequestError, match="one per prompt"):
        tiny_llm.generate(prompts, per_prompt[:1])


def test_snapshot_is_a_read_only_copy(tiny_llm: LLM) -> None:
    engine = tiny_llm.engine
    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    before = engine.snapshot()
    assert before.waiting == (rid,) and before.requests[rid].num_computed_tokens == 0
    engine.step()
    after = engine.snapshot()
    assert after.running == (rid,) and after.kv_blocks_used == 1 and after.requests[rid].prefilled
    assert before.waiting == (rid,) and before.kv_blocks_used == 0  # the old one did not move
    with pytest.raises(TypeError):
        after.requests[rid] = before.requests[rid]  # type: ignore[index]
    engine.abort(rid)
    assert engine.snapshot().kv_blocks_used == 0


def test_embed_is_unit_length_and_checks_ids(tiny_llm: LLM) -> None:
    vectors = tiny_llm.engine.embed([[5, 6, 7], [5, 6, 7], [9]])
    assert vectors[0] == vectors[1] and vectors[0] != vectors[2]
    assert abs(sum(v * v for v in vectors[2]) - 1.0) < 1e-5
    with pytest.raises(InvalidRequestError):
        tiny_llm.engine.embed([[]])
