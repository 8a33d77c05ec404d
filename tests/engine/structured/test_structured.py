"""Grammar-constrained decoding in the engine: every output matches its grammar, on the random-weight
`tiny` (only the mask can make it valid), and a constrained request keeps the bits of its solo run
whatever shares its batch."""

from __future__ import annotations

import json
import random
import re

import pytest

from engine import testing
from engine.errors import InvalidRequestError
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from tests.engine_runs import run_to_end

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
        "contact": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
    },
    "required": ["name", "age", "role", "tags", "contact"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "enum": ["red", "green", "blue"]}},
}


def _valid_person(value: dict) -> bool:
    return (
        set(value) == set(PERSON["properties"])
        and isinstance(value["name"], str)
        and len(value["name"]) <= 12
        and isinstance(value["age"], int)
        and 0 <= value["age"] <= 130
        and value["role"] in ("admin", "user", "guest")
        and len(value["tags"]) <= 3
        and all(t in ("red", "green", "blue") for t in value["tags"])
        and (value["contact"] is None or len(value["contact"]) <= 8)
    )


def _prompts(vocab: int, n: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 30))] for _ in range(n)]


def test_json_schema_output_always_validates_on_random_weights(tiny_llm: LLM):
    grammar = Grammar.json_schema(PERSON)
    params = [SamplingParams(max_tokens=256, temperature=1.0, seed=s, grammar=grammar) for s in range(24)]
    outs = tiny_llm.generate(_prompts(tiny_llm.model_config.vocab_size, 24), params)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        assert _valid_person(json.loads(out.text)), out.text


def test_regex_choice_lark_and_gbnf_grammars_are_matched(tiny_llm: LLM):
    cases = [
        (
            Grammar.regex(r"[a-z]{1,8}@[a-z]{2,6}\.(com|org)"),
            lambda t: re.fullmatch(r"[a-z]{1,8}@[a-z]{2,6}\.(com|org)", t),
        ),
        (Grammar.choice(["yes", "no", "maybe later"]), lambda t: t in ("yes", "no", "maybe later")),
        (
            Grammar.lark('start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/'),
            lambda t: re.fullmatch(r"\(\d{1,3}(\+\d{1,3})*\)", t),
        ),
        (Grammar.gbnf('root ::= "x" [0-9] [0-9]? "!"'), lambda t: re.fullmatch(r"x\d\d?!", t)),
    ]
    prompts = _prompts(tiny_llm.model_config.vocab_size, 6, seed=9)
    for grammar, matches in cases:
        params = [SamplingParams(max_tokens=64, temperature=1.0, seed=s, grammar=grammar) for s in range(6)]
        for out in tiny_llm.generate(prompts, params):
            if out.finish_reason == "stop":
                assert matches(out.text), (grammar.kind, out.text)
            else:  # an unbounded repetition may run to the limit: a prefix of a match, never past it
                assert out.finish_reason == "length" and grammar.kind == "lark", out.text


def test_constrained_requests_keep_their_solo_bits_in_a_mixed_batch(tiny_llm: LLM):
    engine = tiny_llm.engine
    prompts = _prompts(tiny_llm.model_config.vocab_size, 16, seed=11)
    grammar = Grammar.json_schema(PERSON)
    params = [
        SamplingParams(
            max_tokens=96,
            temperature=0.9 if i % 4 else 0.0,
            seed=100 + i,
            logprobs=0,
            grammar=grammar if i % 2 == 0 else None,
        )
        for i in range(16)
    ]
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    together = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                together[out.request_id] = (out.token_ids, out.logprobs)
    for prompt, sp, rid in zip(prompts, params, ids, strict=True):
        assert run_to_end(engine, [prompt], sp) == [together[rid]]


def test_preempted_constrained_request_resumes_its_grammar(tiny_loaded):
    from engine.config import EngineConfig
    from engine.llm_engine import Engine

    grammar = Grammar.json_schema(PERSON)
    params = SamplingParams(max_tokens=120, temperature=1.0, seed=5, grammar=grammar, logprobs=0)
    prompts = _prompts(tiny_loaded.config.vocab_size, 6, seed=13)
    roomy = Engine(tiny_loaded, EngineConfig(num_kv_blocks=256))
    tight = Engine(tiny_loaded, EngineConfig(num_kv_blocks=24, block_size=16))
    solo = run_to_end(roomy, prompts, params, together=False)
    squeezed = run_to_end(tight, prompts, params)
    assert tight.counters.preemptions > 0
    assert squeezed == solo
    for tokens, _ in squeezed:
        assert _valid_person(json.loads(tiny_loaded.tokenizer.decode(tokens)))


def test_logit_bias_steers_choice_but_logprobs_stay_the_models(tiny_llm: LLM):
    prompt = _prompts(tiny_llm.model_config.vocab_size, 1, seed=2)[0]
    plain = tiny_llm.generate([prompt], SamplingParams(max_tokens=4, logprobs=0, ignore_eos=True))[0]
    forced = tiny_llm.generate(
        [prompt], SamplingParams(max_tokens=4, logprobs=0, ignore_eos=True, logit_bias={77: 100.0})
    )[0]
    assert forced.token_ids == [77] * 4
    assert forced.logprobs[0] < -0.5  # the model's own view of token 77, not the biased certainty
    banned = tiny_llm.generate(
        [prompt], SamplingParams(max_tokens=4, ignore_eos=True, logit_bias={plain.token_ids[0]: -100.0})
    )[0]
    assert banned.token_ids[0] != plain.token_ids[0]


def test_max_tokens_ends_a_grammar_that_has_not_finished(tiny_llm: LLM):
    out = tiny_llm.generate(
        [[5, 6, 7]],
        SamplingParams(max_tokens=5, temperature=1.0, seed=1, grammar=Grammar.json_schema(PERSON)),
    )[0]
    start = '{"name": "'  # a prefix of a valid document, cut by the limit
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert start.startswith(out.text) or out.text.startswith(start)


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        (
            lambda: Grammar.json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}),
            "nope",
        ),
        (lambda: Grammar.regex("[a-z"), "unclosed character class"),
        (lambda: Grammar.lark("start: undefined_rule"), "undefined_rule"),
        (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
        (lambda: Grammar.choice([]), "non-empty list"),
    ],
)
def test_a_bad_grammar_is_one_clear_error(tiny_llm: LLM, grammar, says):
    with pytest.raises(InvalidRequestError, match=re.escape(says)):
        tiny_llm.engine.add_request([1, 2, 3], SamplingParams(grammar=grammar()))
    assert not tiny_llm.engine.has_unfinished()


def test_mask_switched_off_lets_random_weights_break_the_schema(tiny_llm: LLM):
    grammar = Grammar.json_schema(PERSON)
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, grammar=grammar) for s in range(6)]
    prompts = _prompts(tiny_llm.model_config.vocab_size, 6, seed=4)
    with testing.grammar_mask_off(tiny_llm.engine):
        outs = tiny_llm.generate(prompts, params)
    assert not any(out.text.startswith('{"name": "') for out in outs)


@pytest.mark.parametrize("overlap", [True, False])
def test_masks_on_a_thread_or_inline_give_the_same_bits(tiny_llm: LLM, overlap: bool):
    from engine.structured import MaskWorker

    engine = tiny_llm.engine
    prompts = _prompts(tiny_llm.model_config.vocab_size, 6, seed=17)
    params = SamplingParams(
        max_tokens=80, temperature=0.8, seed=9, grammar=Grammar.json_schema(PERSON), logprobs=0
    )
    reference = run_to_end(engine, prompts, params)
    engine._masks = MaskWorker(overlap=overlap)
    before = engine.counters
    assert run_to_end(engine, prompts, params) == reference
    after = engine.counters
    assert after.grammar_masks - before.grammar_masks == sum(len(t) for t, _ in reference)
    assert after.grammar_mask_seconds > before.grammar_mask_seconds
