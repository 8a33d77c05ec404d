"""The sampler row by row: seeds, greedy, top-k, top-p, min-p, the three penalties and the logprobs it
reports, each checked against a hand computation on a small vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from engine import kernels
from engine.layers.sampler import SampleRequest, apply_penalties, filtered_probs, sample, sample_batch
from engine.sampling_params import SamplingParams


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _support(
    logits: torch.Tensor, params: SamplingParams, draws: int = 300, prompt=(), output=()
) -> set[int]:
    """The tokens drawn over many seeds."""
    return {sample(logits, params, _gen(seed), list(prompt), list(output)).token_id for seed in range(draws)}


def _probs_from(logits: list[float]) -> torch.Tensor:
    return torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)


# logits whose probabilities are far from every boundary used below (sorted: 0 > 3 > 1 > 5 > 2 > 4)
LOGITS = torch.tensor([3.0, 1.5, 0.2, 2.5, -1.0, 1.0])
ORDER = [0, 3, 1, 5, 2, 4]


# ---- seeds -----------------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_tokens_and_other_seeds_other_tokens():
    logits = torch.zeros(1000)  # uniform: two seeds agreeing on 20 draws by chance is out of the question
    params = SamplingParams(temperature=1.0)

    def draws(seed: int) -> list[int]:
        gen = _gen(seed)
        return [sample(logits, params, gen, [], []).token_id for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert len({tuple(draws(s)) for s in range(5)}) == 5


def test_sampling_uses_only_the_requests_own_generator():
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    gen = _gen(3)
    first = [sample(LOGITS, SamplingParams(temperature=1.0), gen, [], []).token_id for _ in range(10)]
    assert torch.equal(torch.get_rng_state(), global_state)
    torch.rand(100)  # someone else draws from the global stream in between: no effect on ours
    gen = _gen(3)
    assert [sample(LOGITS, SamplingParams(temperature=1.0), gen, [], []).token_id for _ in range(10)] == first


def test_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    gen = _gen(11)
    counts = [0, 0, 0]
    for _ in range(3000):
        counts[sample(logits, SamplingParams(temperature=1.0), gen, [], []).token_id] += 1
    for count, p in zip(counts, (0.6, 0.3, 0.1), strict=True):
        assert abs(count / 3000 - p) < 4 * math.sqrt(p * (1 - p) / 3000)  # 4 sigma


# ---- greedy and temperature ------------------------------------------------------------------


def test_temperature_zero_is_argmax_whatever_the_filters_and_the_seed():
    for params in (
        SamplingParams(),
        SamplingParams(temperature=0.0, top_k=2, top_p=0.1, min_p=0.9),
    ):
        assert {sample(LOGITS, params, _gen(s), [], []).token_id for s in range(20)} == {0}
    gen = _gen(5)
    state = gen.get_state()
    sample(LOGITS, SamplingParams(), gen, [], [])
    assert torch.equal(gen.get_state(), state)  # greedy draws nothing


def test_temperature_scales_the_logits_before_the_softmax():
    for temperature in (0.5, 1.0, 2.0):
        got = filtered_probs(LOGITS, SamplingParams(temperature=temperature))
        expected = _probs_from((LOGITS.double() / temperature).tolist())
        assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-7)


def test_a_tiny_temperature_stays_finite_and_picks_the_argmax():
    probs = filtered_probs(LOGITS, SamplingParams(temperature=1e-4))
    assert torch.isfinite(probs).all()
    assert probs[0] == 1.0 and probs.sum() == 1.0
    assert _support(LOGITS, SamplingParams(temperature=1e-4), draws=20) == {0}


# ---- top-k, top-p, min-p ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_top_k_keeps_exactly_the_k_best(k):
    params = SamplingParams(temperature=1.0, top_k=k)
    probs = filtered_probs(LOGITS, params)
    kept = set(ORDER[:k])
    assert {i for i in range(6) if probs[i] > 0} == kept
    expected = torch.zeros(6, dtype=torch.float64)
    expected[ORDER[:k]] = _probs_from(LOGITS[ORDER[:k]].tolist())  # renormalised over the kept tokens
    assert torch.allclose(probs.double(), expected, rtol=1e-5, atol=1e-7)
    assert _support(LOGITS, params) == kept


def test_top_k_of_the_whole_vocabulary_or_more_changes_nothing():
    plain = filtered_probs(LOGITS, SamplingParams(temperature=1.0))
    for k in (6, 7, 1000):
        assert torch.equal(filtered_probs(LOGITS, SamplingParams(temperature=1.0, top_k=k)), plain)


def _smallest_set_reaching(probs: torch.Tensor, p: float) -> set[int]:
    order = torch.argsort(probs, descending=True).tolist()
    kept, total = [], 0.0
    for i in order:
        kept.append(i)
        total += float(probs[i])
        if total >= p:
            break
    return set(kept)


def _assert_keeps_exactly(params: SamplingParams, full: torch.Tensor, kept: set[int]) -> None:
    """The filtered distribution over LOGITS keeps exactly ``kept``, renormalised, and draws only from it."""
    probs = filtered_probs(LOGITS, params)
    assert {i for i in range(6) if probs[i] > 0} == kept
    expected = torch.zeros(6, dtype=torch.float64)
    expected[sorted(kept)] = full[sorted(kept)] / full[sorted(kept)].sum()
    assert torch.allclose(probs.double(), expected, rtol=1e-5, atol=1e-7)
    assert _support(LOGITS, params, draws=200) == kept


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p):
    params = SamplingParams(temperature=1.0, top_p=top_p)
    full = _probs_from(LOGITS.tolist())
    kept = _smallest_set_reaching(full, top_p)
    _assert_keeps_exactly(params, full, kept)


def test_top_p_exactly_reached_keeps_no_more_tokens():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25]))  # exact in float32: 1/2, 1/4, 1/4
    assert kernels.softmax(logits).tolist() == [0.5, 0.25, 0.25]
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0]  # token 0 alone reaches 0.5: the next one goes
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.50001))
    assert probs.tolist()[0] < 1.0 and int((probs > 0).sum()) == 2  # just past it: one more is needed


@pytest.mark.parametrize("min_p", [0.1, 0.3, 0.5, 0.9])
def test_min_p_drops_tokens_under_min_p_times_the_best(min_p):
    params = SamplingParams(temperature=1.0, min_p=min_p)
    full = _probs_from(LOGITS.tolist())
    kept = {i for i in range(6) if full[i] >= min_p * full.max()}
    _assert_keeps_exactly(params, full, kept)


def test_temperature_comes_before_top_p_and_min_p():
    # at temperature 0.25 token 0 alone holds over 0.85 of the mass; at 1.0 it holds about 0.43
    cold = filtered_probs(LOGITS, SamplingParams(temperature=0.25, top_p=0.8))
    assert {i for i, p in enumerate(cold) if p} == {0}
    assert int((filtered_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.8)) > 0).sum()) == 3
    hot = filtered_probs(LOGITS, SamplingParams(temperature=4.0, min_p=0.5))
    warm = filtered_probs(LOGITS, SamplingParams(temperature=1.0, min_p=0.5))
    assert int((hot > 0).sum()) > int((warm > 0).sum())


def test_filters_combine_top_k_then_top_p_then_min_p():
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.9, min_p=0.3)
    four = _probs_from(LOGITS[ORDER[:4]].tolist())  # over tokens 0, 3, 1, 5
    kept = [ORDER[i] for i in sorted(_smallest_set_reaching(four, 0.9))]
    mass = torch.tensor([four[ORDER.index(t)] for t in kept], dtype=torch.float64)
    mass = mass / mass.sum()
    kept = [t for t, m in zip(kept, mass, strict=True) if m >= 0.3 * mass.max()]
    probs = filtered_probs(LOGITS, params)
    assert {i for i in range(6) if probs[i] > 0} == set(kept)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)


# ---- penalties -------------------------------------------------------------------------------

PEN_LOGITS = torch.tensor([2.0, -2.0, 1.0, -1.0, 4.0, 0.5])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    got = apply_penalties(PEN_LOGITS, params, prompt=[0, 1, 1], output=[3, 9999])  # 9999: outside the vocab
    assert got.tolist() == [1.0, -4.0, 1.0, -2.0, 4.0, 0.5]
    assert PEN_LOGITS.tolist() == [2.0, -2.0, 1.0, -1.0, 4.0, 0.5]  # the input is not modified
    below_one = apply_penalties(PEN_LOGITS, SamplingParams(repetition_penalty=0.5), [0, 1], [])
    assert below_one.tolist() == [4.0, -1.0, 1.0, -1.0, 4.0, 0.5]  # < 1 favours seen tokens


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    params = SamplingParams(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.25)
    got = apply_penalties(PEN_LOGITS, params, prompt=[0, 1, 2], output=[2, 4, 4, 4, 7])  # 7: no such token
    # token 2: once -> 1 - 0.25 - 0.5; token 4: three times -> 4 - 0.75 - 0.5; prompt tokens 0, 1 untouched
    assert got.tolist() == [2.0, -2.0, 0.25, -1.0, 2.75, 0.5]
    assert apply_penalties(PEN_LOGITS, params, prompt=[0, 1, 2], output=[]).tolist() == PEN_LOGITS.tolist()


def test_negative_presence_and_frequency_penalties_favour_generated_tokens():
    params = SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5)
    got = apply_penalties(PEN_LOGITS, params, prompt=[], output=[5, 5])
    assert got.tolist() == [2.0, -2.0, 1.0, -1.0, 4.0, 2.5]


def test_all_three_penalties_repetition_first():
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=1.0, frequency_penalty=0.5)
    got = apply_penalties(PEN_LOGITS, params, prompt=[1], output=[4, 4, 3])
    # 1: -2*2; 3: -1*2 - 0.5 - 1; 4: 4/2 - 1.0 - 1
    assert got.tolist() == [2.0, -4.0, 1.0, -3.5, 0.0, 0.5]


def test_no_penalty_returns_the_logits_untouched():
    assert apply_penalties(PEN_LOGITS, SamplingParams(), [0, 1], [2]) is PEN_LOGITS


def test_greedy_picks_the_argmax_after_penalties():
    assert sample(PEN_LOGITS, SamplingParams(), _gen(0), [], []).token_id == 4
    # token 4 seen in the prompt: 4 / 3 < 2 -> token 0 wins
    assert sample(PEN_LOGITS, SamplingParams(repetition_penalty=3.0), _gen(0), [4], []).token_id == 0
    # presence applies to generated tokens only: a prompt token keeps its place
    assert sample(PEN_LOGITS, SamplingParams(presence_penalty=2.0), _gen(0), [4], []).token_id == 4
    assert sample(PEN_LOGITS, SamplingParams(frequency_penalty=2.0), _gen(0), [], [4]).token_id == 0


def test_penalties_shape_the_sampled_distribution():
    logits = torch.zeros(4)
    params = SamplingParams(temperature=1.0, frequency_penalty=2.0)
    # token 0 generated ten times: its logit falls by 20, e^-20 of the mass: never drawn in 300
    assert _support(logits, params, output=[0] * 10) == {1, 2, 3}
    assert _support(logits, SamplingParams(temperature=1.0), output=[0] * 10) == {0, 1, 2, 3}
    penalised = filtered_probs(apply_penalties(logits, params, [], [0] * 10), params)
    expected = _probs_from([-20.0, 0.0, 0.0, 0.0])
    assert torch.allclose(penalised.double(), expected, rtol=1e-5, atol=1e-9)


# ---- what the sampler reports ----------------------------------------------------------------


def test_the_reported_logprob_is_the_raw_models_log_softmax_of_the_chosen_token():
    """The logprob is of the model's own distribution (raw logits), not of the processed one: it does not
    move with temperature, filters or penalties (vLLM's default, ``raw_logprobs``)."""
    raw = torch.log_softmax(PEN_LOGITS.double(), 0)
    ours = kernels.softmax(PEN_LOGITS, log=True)
    for params in (
        SamplingParams(),
        SamplingParams(temperature=0.3, top_k=3),
        SamplingParams(temperature=2.0, top_p=0.5, min_p=0.1),
        SamplingParams(temperature=1.0, repetition_penalty=1.7, presence_penalty=1.0, frequency_penalty=0.5),
    ):
        for seed in range(5):
            got = sample(PEN_LOGITS, params, _gen(seed), [4, 0], [4, 2])
            assert got.logprob == float(ours[got.token_id])
            assert got.logprob == pytest.approx(float(raw[got.token_id]), abs=1e-6)


@pytest.mark.parametrize("n", [1, 3, 6])
def test_top_logprobs_are_the_n_best_raw_log_softmax_values_best_first(n):
    got = sample(PEN_LOGITS, SamplingParams(logprobs=n, repetition_penalty=2.0), _gen(0), [4], [])
    raw = torch.log_softmax(PEN_LOGITS.double(), 0)
    expected_ids = torch.argsort(raw, descending=True)[:n].tolist()
    assert [i for i, _ in got.top] == expected_ids
    for i, value in got.top:
        assert value == pytest.approx(float(raw[i]), abs=1e-6)
    values = [v for _, v in got.top]
    assert values == sorted(values, reverse=True)
    assert got.token_id == 0  # the choice is penalised (4 / 2 = 2 ties 0, the first wins); the report is raw


def test_no_top_logprobs_unless_asked():
    assert sample(LOGITS, SamplingParams(), _gen(0), [], []).top == []
    assert sample(LOGITS, SamplingParams(logprobs=0), _gen(0), [], []).top == []


def test_a_row_of_the_real_vocabulary_size_samples_fast_and_stays_normalised():
    logits = torch.randn(49152, generator=_gen(1)) * 4
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05)
    probs = filtered_probs(logits, params)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
    assert 0 < int((probs > 0).sum()) <= 50
    top50 = set(torch.topk(logits, 50).indices.tolist())
    assert {sample(logits, params, _gen(s), [], []).token_id for s in range(5)} <= top50


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_k=40),
        SamplingParams(temperature=1.0, min_p=0.01),
    ],
    ids=["plain", "top_p", "top_k", "min_p"],
)
def test_the_sampling_distribution_has_the_same_bits_at_any_thread_count(params):
    """The renormalisation after the filters must not go through a library sum (its order follows the
    thread count): the distribution multinomial draws from is the same bits at 1 and 2 threads."""
    logits = torch.randn(49152, generator=_gen(0)) * 2
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = filtered_probs(logits, params)
        torch.set_num_threads(2)
        two = filtered_probs(logits, params)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(one, two)


# ---- the whole step at once ------------------------------------------------------------------


def test_sample_batch_gives_each_row_what_it_gets_alone():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 300, generator=gen)
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.8, seed=3),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=4),
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(logprobs=3),
    ]
    history = [[1, 2], [3], [], [7, 7, 9], [4]]
    requests = [
        SampleRequest(p, _gen(i), [5, 6], h) for i, (p, h) in enumerate(zip(params, history, strict=True))
    ]
    batched = sample_batch(logits, requests)
    alone = [
        sample(logits[i], p, _gen(i), [5, 6], h) for i, (p, h) in enumerate(zip(params, history, strict=True))
    ]
    assert batched == alone
    assert sample_batch(torch.empty(0, 300), []) == []


def test_sample_batch_keeps_a_failing_row_to_itself():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(8))
    broken = SampleRequest(SamplingParams(temperature=1.0, seed=1), "not a generator", [], [])  # type: ignore[arg-type]
    first, second = sample_batch(logits, [SampleRequest(SamplingParams(), _gen(0), [], []), broken])
    assert isinstance(second, TypeError)
    assert not isinstance(first, Exception) and first.token_id == int(torch.argmax(logits[0]))
