"""Speculative decoding keeps every bit: outputs equal the plain run's, whatever the proposer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from engine import testing
from engine.errors import InvalidRequestError, NxError
from engine.layers.sampler import Sample
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.speculative.adaptive import SpecBackoff
from engine.speculative.ngram import propose_ngram
from engine.speculative.verifier import VerifyFaults, verify_run, verify_run_with_faults
from gates.runs import run_together

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
TINY = str(FIXTURES / "tiny")


def test_ngram_proposes_what_followed_the_latest_longest_match() -> None:
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose_ngram(tokens, 2) == [7, 8]  # the most recent earlier [1, 2, 3] is followed by 7, 8
    assert propose_ngram(tokens, 10) == [7, 8, 5, 1, 2, 3]  # up to the end, never past it
    assert propose_ngram([4, 5, 6, 7], 3) == []  # no suffix occurred before
    assert propose_ngram([5, 6, 1, 2, 5, 6], 3, ngram_min=2) == [1, 2, 5]
    assert propose_ngram([5, 6, 1, 2, 6], 3, ngram_min=2) == []  # a one-token match is below ngram_min
    assert propose_ngram([5, 6, 1, 2, 6], 3, ngram_min=1) == [1, 2, 6]


def test_backoff_follows_acceptance_then_pauses_after_misses() -> None:
    state = SpecBackoff(8)
    assert state.wants() == 8  # the prior (0.75) pays for all K
    for _ in range(3):
        state.record(8, 0)
    assert state.length == 1 and state.paused == 1  # nothing accepted three times: one step paused
    assert [state.wants() for _ in range(2)] == [0, 1]
    state.record(1, 0)
    assert [state.wants() for _ in range(3)] == [0, 0, 1]  # the pause doubles
    for _ in range(4):
        state.record(8, 8)  # long runs accepted: the estimate climbs back, and with it the length
    assert state.misses == 0 and state.wants() == 8
    for _ in range(5):
        state.record(8, 1)
    assert 1 <= state.wants() < 8  # one accepted of eight, again and again: shorter proposals


def _run(draws: list[int], proposals: list[int], finish_at: int | None = None, **faults: bool):
    emitted: list[int] = []
    sampled: list[int] = []

    def sample_row(i: int) -> Sample:
        sampled.append(i)
        return Sample(draws[i], -1.0, [])

    def emit(choice: Sample) -> bool:
        emitted.append(choice.token_id)
        return finish_at is not None and len(emitted) == finish_at

    if faults:
        verdict = verify_run_with_faults(proposals, sample_row, emit, VerifyFaults(**faults))
    else:
        verdict = verify_run(proposals, sample_row, emit)
    return verdict, emitted, sampled


def test_verifier_stops_at_the_first_differing_draw() -> None:
    verdict, emitted, sampled = _run([5, 6, 9, 7], [5, 6, 7])
    assert emitted == [5, 6, 9] and sampled == [0, 1, 2]  # row 3 is never sampled
    assert (verdict.accepted, verdict.valid_rows) == (2, 3)
    verdict, emitted, _ = _run([5, 6, 7, 8], [5, 6, 7])
    assert emitted == [5, 6, 7, 8] and (verdict.accepted, verdict.valid_rows) == (3, 4)  # a bonus token
    verdict, emitted, _ = _run([5, 6, 7, 8], [5, 6, 7], finish_at=2)
    assert emitted == [5, 6] and verdict.accepted == 2  # finished inside an accepted run
    verdict, emitted, _ = _run([1, 6, 7, 8], [5, 6, 7])
    assert emitted == [1] and (verdict.accepted, verdict.valid_rows) == (0, 1)


def test_verifier_faults_change_what_is_emitted() -> None:
    _, emitted, _ = _run([5, 1, 7, 8], [5, 6, 7], accept_wrong=True)
    assert emitted == [5, 6, 7, 8]
    verdict, emitted, _ = _run([5, 1, 7, 8], [5, 6, 7], keep_rejected_kv=True)
    assert emitted == [5, 1, 7] and verdict.valid_rows == 3


PROMPTS = [
    "the cat sat on the mat and the cat sat on the mat and the cat",
    "one two three four one two three four one two",
    "hello world, hello world, hello",
    "a b c d e f g a b c d",
]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=40, temperature=0, logprobs=2),
        SamplingParams(max_tokens=37, temperature=0.8, seed=7),
        SamplingParams(max_tokens=33, temperature=1.0, top_p=0.9, top_k=40, seed=3, repetition_penalty=1.1),
        SamplingParams(max_tokens=30, temperature=0.7, seed=11, stop=["e"], frequency_penalty=0.3),
    ]


def _outputs(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple]:
    outs = llm.generate(prompts, params)
    return [(o.token_ids, o.logprobs, o.top_logprobs, o.text, o.finish_reason) for o in outs]


@pytest.fixture(scope="module")
def plain_tiny() -> LLM:
    return LLM("tiny", num_kv_blocks=128)


@pytest.mark.parametrize(
    "settings",
    [
        {"speculative": "ngram", "num_speculative_tokens": 4},
        {"speculative": "draft", "draft_model": "layers:1", "num_speculative_tokens": 3},
        {"speculative": "draft", "draft_model": TINY, "num_speculative_tokens": 5},
        {
            "speculative": "draft",
            "draft_model": str(FIXTURES / "families" / "qwen2"),
            "num_speculative_tokens": 2,
        },
    ],
    ids=["ngram", "draft-first-layer", "draft-twin", "draft-qwen2-same-tokenizer"],
)
def test_speculative_outputs_equal_plain_outputs(plain_tiny: LLM, settings: dict) -> None:
    spec = LLM("tiny", num_kv_blocks=128, **settings)
    prompts = [plain_tiny.tokenizer.encode(p) for p in PROMPTS]
    together = _outputs(spec, prompts, _params())
    assert together == _outputs(plain_tiny, prompts, _params())
    alone = [_outputs(spec, [p], [sp])[0] for p, sp in zip(prompts, _params(), strict=True)]
    assert alone == together
    counters = spec.engine.counters
    assert counters.spec_drafts > 0 and counters.spec_draft_tokens >= counters.spec_accepted_tokens
    assert spec.engine.snapshot().kv_blocks_used == 0  # rejected positions' blocks came back too


def test_a_twin_draft_is_always_accepted_greedy_and_seeded() -> None:
    """The draft is the target itself and samples with a clone of the request's generator: it proposes
    exactly what the target draws, so every proposal is accepted, sampled requests included."""
    spec = LLM("tiny", num_kv_blocks=128, speculative="draft", draft_model=TINY, num_speculative_tokens=4)
    prompts = [spec.tokenizer.encode(p) for p in PROMPTS[:2]]
    params = [
        SamplingParams(max_tokens=30, temperature=0),
        SamplingParams(max_tokens=30, temperature=1.0, seed=5),
    ]
    spec.generate(prompts, params)
    c = spec.engine.counters
    assert c.spec_accepted_tokens == c.spec_draft_tokens > 0
    assert c.spec_mean_accepted_length is not None and c.spec_mean_accepted_length > 4


def test_speculation_survives_preemption_and_prefix_hits(plain_tiny: LLM) -> None:
    """A pool too small for every request at once (preemption by recompute) and prompts sharing a long
    prefix (cache hits), with a draft that is often wrong: still the plain run's tokens, and every
    block back in the pool at the end."""
    settings = {"num_kv_blocks": 12, "block_size": 4, "prefill_chunk": 8}
    spec = LLM("tiny", speculative="draft", draft_model="layers:1", num_speculative_tokens=4, **settings)
    plain = LLM("tiny", **settings)
    shared = spec.tokenizer.encode(PROMPTS[0])
    prompts = [shared + spec.tokenizer.encode(t) for t in (" again", " more", " then", " so")]
    params = [SamplingParams(max_tokens=14, temperature=0.9, seed=i) for i in range(4)]
    got = run_together(spec.engine, list(zip(prompts, params, strict=True)))
    want = run_together(plain.engine, list(zip(prompts, params, strict=True)))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.logprobs for o in got] == [o.logprobs for o in want]
    assert spec.engine.counters.preemptions > 0 and spec.engine.snapshot().prefix_hits > 0
    assert spec.engine.counters.spec_drafts > 0
    assert spec.engine.snapshot().kv_blocks_used == 0


def test_speculation_pauses_while_the_batch_is_large() -> None:
    spec = LLM("tiny", num_kv_blocks=128, speculative="ngram", num_speculative_tokens=3, spec_max_batch=2)
    prompt = spec.tokenizer.encode(PROMPTS[1])
    spec.generate([prompt] * 3, SamplingParams(max_tokens=20, temperature=0))
    assert spec.engine.counters.spec_drafts == 0  # three decoding the whole time: over the limit of 2
    spec.generate([prompt], SamplingParams(max_tokens=20, temperature=0))
    assert spec.engine.counters.spec_drafts > 0


def test_requests_with_a_grammar_speculate_and_keep_their_bits(plain_tiny: LLM) -> None:
    """A constrained request's proposals are cut where its grammar would refuse them and its verify
    rows are masked one at a time from the grammar's state there: outputs equal the plain run's,
    greedy and seeded, beside an unconstrained request, and repetitive JSON gets proposals accepted."""
    from engine.structured.grammar import Grammar

    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "maxLength": 4}, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
                "maxItems": 6,
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    }
    grammars = [
        Grammar.json_schema(json.dumps(schema)),
        Grammar.regex("(ab|cd ){3,12}"),
        Grammar.choice(["yes", "no"]),
    ]
    prompts = [plain_tiny.tokenizer.encode(p) for p in PROMPTS[:4]]
    params = [
        SamplingParams(max_tokens=120, temperature=t, seed=7, grammar=g) for g in grammars for t in (0.0, 0.8)
    ] + [_params()[0]]
    prompts = [prompts[i % len(prompts)] for i in range(len(params))]
    spec = LLM("tiny", num_kv_blocks=128, speculative="ngram", num_speculative_tokens=6)
    assert _outputs(spec, prompts, params) == _outputs(plain_tiny, prompts, params)
    constrained = LLM("tiny", num_kv_blocks=128, speculative="ngram", num_speculative_tokens=6)
    _outputs(constrained, prompts[:4], params[:4])  # the JSON and regex requests alone
    assert constrained.engine.counters.spec_accepted_tokens > 0


def test_a_verifying_request_counts_as_a_decode_not_a_prefill_chunk() -> None:
    """Steps that ran a plain decode beside a verify (its last token and proposals) are not "mixed"."""
    from engine.structured.grammar import Grammar

    spec = LLM("tiny", num_kv_blocks=128, speculative="draft", draft_model=TINY, num_speculative_tokens=3)
    prompt = spec.tokenizer.encode(PROMPTS[0])
    params = [
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, grammar=Grammar.regex("[a-z ]{12,40}")),
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
    ]
    spec.generate([prompt, prompt], params)  # one prefill step for both, then decodes and verifies
    assert spec.engine.counters.spec_drafts > 0 and spec.engine.counters.mixed_steps == 0


@pytest.mark.parametrize("fault", [testing.spec_accept_wrong, testing.spec_keep_rejected_kv])
def test_verifier_faults_break_equality(plain_tiny: LLM, fault) -> None:
    spec = LLM(
        "tiny", num_kv_blocks=128, speculative="draft", draft_model="layers:1", num_speculative_tokens=4
    )
    prompts = [plain_tiny.tokenizer.encode(p) for p in PROMPTS]
    with fault(spec.engine):
        broken = _outputs(spec, prompts, _params())
    assert broken != _outputs(plain_tiny, prompts, _params())
    assert _outputs(spec, prompts, _params()) == _outputs(plain_tiny, prompts, _params())  # undone on exit


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"speculative": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be"),
        ({"speculative": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens must be"),
        ({"speculative": "medusa"}, "unknown speculative method"),
        ({"speculative": "draft"}, "needs a draft model"),
        ({"speculative": "draft", "draft_model": "layers:2"}, "choose N in [1, 1]"),
        ({"speculative": "draft", "draft_model": "layers:x"}, "layers:N"),
        ({"speculative": "draft", "draft_model": "no-such-model"}, "cannot be loaded"),
        ({"speculative": "draft", "draft_model": "smollm2"}, "vocabulary of 49152 tokens"),
    ],
)
def test_bad_speculative_settings_are_one_clear_error(settings: dict, message: str) -> None:
    with pytest.raises(NxError) as info:
        LLM("tiny", num_kv_blocks=16, **settings)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_draft_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    import json
    import shutil

    other = tmp_path / "other"
    shutil.copytree(FIXTURES / "tiny", other)
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(InvalidRequestError, match="another tokenizer"):
        LLM("tiny", num_kv_blocks=16, speculative="draft", draft_model=str(other))


@pytest.mark.parametrize("draft", ["layers:1", "tiny"])
def test_a_draft_model_s_memory_is_in_its_target_s_footprint(draft: str) -> None:
    """A pool under a budget counts the draft's weights and KV pool beside the target's: the computed
    bytes equal what the running draft proposer holds."""
    from engine.mux.footprint import footprint_of_spec
    from engine.mux.registry import ModelSpec
    from engine.settings import EngineSettings

    settings = EngineSettings(num_kv_blocks=32, speculative="draft", draft_model=draft)
    spec = ModelSpec(id=1, name="tiny", source="tiny", engine=settings)
    plain = dataclasses.replace(
        spec, engine=dataclasses.replace(settings, speculative=None, draft_model=None)
    )
    llm = LLM("tiny", **settings.as_fields())
    held = llm.engine._speculator.proposer.weight_bytes  # type: ignore[union-attr]
    with_draft = footprint_of_spec(spec)
    assert with_draft.draft_bytes == held > 0
    assert with_draft.total_bytes == footprint_of_spec(plain).total_bytes + held
