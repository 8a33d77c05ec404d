"""The step's boundaries without a model: Scheduler.update_from_output over a hand-made
ModelRunnerOutput, check_stop, and the Speculator switched off."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.kv.block_pool import BlockPool
from engine.layers.sampler import Sample
from engine.loader import ChatTokenizer, IncrementalDetokenizer, load_tokenizer
from engine.sampling_params import SamplingParams
from engine.scheduler import ModelRunnerOutput, Scheduler
from engine.sequence import Sequence, Status
from engine.settings import SpecConfig
from engine.snapshot import EngineCounters
from engine.speculative.speculator import Speculator
from engine.speculative.verifier import VerifyResult
from engine.stop_check import check_stop

BLOCK = 4
EOS = 0


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return load_tokenizer("tiny")[1]


def _seq(tokenizer: ChatTokenizer, rid: str, prompt: list[int], params: SamplingParams) -> Sequence:
    return Sequence(
        request_id=rid,
        prompt_token_ids=prompt,
        params=params,
        generator=torch.Generator().manual_seed(0),
        detokenizer=IncrementalDetokenizer(tokenizer),
        max_total_tokens=64,
        arrival_time=0.0,
        arrival_seq=int(rid[1:]),
    )


def _scheduler() -> Scheduler:
    config = EngineConfig(num_kv_blocks=16, block_size=BLOCK, prefill_chunk=16)
    return Scheduler(config, BlockPool(16, BLOCK), "test", stop_token_ids=frozenset({EOS}))


def _draw(token_id: int) -> Sample:
    return Sample(token_id, -0.5, [])


def test_update_appends_draws_and_finishes_stopped_requests_freeing_blocks(tokenizer: ChatTokenizer) -> None:
    sched = _scheduler()
    going = _seq(tokenizer, "r0", [5, 6, 7, 8, 9], SamplingParams(max_tokens=8))
    stopped = _seq(tokenizer, "r1", [5, 6], SamplingParams(max_tokens=8))
    failing = _seq(tokenizer, "r2", [7, 8, 9], SamplingParams(max_tokens=8))
    for seq in (going, stopped, failing):
        sched.add(seq)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == [going, stopped, failing]
    assert all(s.seq.first_scheduled_time is not None for s in out.scheduled)
    drawn = ModelRunnerOutput([_draw(11), _draw(EOS), RuntimeError("no row")], {}, now=1.5)
    update = sched.update_from_output(out, drawn)
    assert update.advanced == [going, stopped, failing] and update.verified == []
    assert going.output_token_ids == [11] and going.num_computed_tokens == 5 and not going.finished
    assert going.token_times == [1.5] and going.logprobs == [-0.5]
    assert stopped.finish_reason == "stop" and stopped.block_table == []
    assert failing.finish_reason == "error" and failing.error == "RuntimeError: no row"
    assert sched.running == [going] and sched.pool.num_used == len(going.block_table) == 2
    assert sched.num_generated_tokens == 2  # the failed draw appended nothing
    assert going.output().token_ids == [11]


def test_a_chunk_short_of_its_prompt_draws_nothing_and_does_not_advance(tokenizer: ChatTokenizer) -> None:
    sched = _scheduler()
    seq = _seq(tokenizer, "r0", list(range(3, 23)), SamplingParams(max_tokens=4))
    sched.add(seq)
    out = sched.schedule()
    assert out.scheduled[0].num_new_tokens == 16  # the first fixed chunk of 20 prompt tokens
    update = sched.update_from_output(out, ModelRunnerOutput([None], {}, now=0.0))
    assert update.advanced == [] and seq.num_computed_tokens == 16 and not seq.output_token_ids
    assert sched.counters.served["default"] == 16.0  # 16 prompt tokens charged, nothing drawn


def test_a_verified_request_keeps_the_rows_that_hold_its_tokens(tokenizer: ChatTokenizer) -> None:
    sched = _scheduler()
    seq = _seq(tokenizer, "r0", [5, 6, 7], SamplingParams(max_tokens=8))
    sched.add(seq)
    sched.update_from_output(sched.schedule(), ModelRunnerOutput([_draw(11)], {}, now=0.0))
    seq.draft_token_ids = [12, 13, 14, 15, 16]  # as a proposer would: rows 3..8, blocks for 9 tokens
    out = sched.schedule()
    assert out.scheduled[0].num_new_tokens == 6 and len(seq.block_table) == 3
    reached: list[int] = []

    def verify(on_row, emit) -> VerifyResult:  # accepts 12, then draws 20 where 13 was proposed
        for i, token in enumerate((12, 20)):
            on_row(i)
            reached.append(seq.num_computed_tokens)
            emit(_draw(token))
        return VerifyResult(accepted=1, valid_rows=2)

    update = sched.update_from_output(out, ModelRunnerOutput([None], {"r0": verify}, now=0.0))
    assert reached == [4, 5] and update.verified == [seq] and update.advanced == [seq]
    assert seq.output_token_ids == [11, 12, 20] and seq.num_computed_tokens == 5
    assert len(seq.block_table) == 2  # the block that held only rejected rows went back


def test_check_stop_cuts_a_stop_string_and_ends_on_length(tokenizer: ChatTokenizer) -> None:
    ids = tokenizer.encode("hello world")
    seq = _seq(tokenizer, "r0", [5], SamplingParams(max_tokens=len(ids), stop=["world"]))
    reasons = []
    for token in ids:
        seq.append_token(_draw(token), 0.0)
        reasons.append(check_stop(seq, token, frozenset({EOS})))
    assert reasons[-1] == "stop" and "world" not in seq.text and seq.text.startswith("hello")
    plain = _seq(tokenizer, "r1", [5], SamplingParams(max_tokens=2))
    plain.append_token(_draw(9), 0.0)
    assert check_stop(plain, 9, frozenset({EOS})) is None
    plain.append_token(_draw(EOS), 0.0)
    assert check_stop(plain, EOS, frozenset({EOS})) == "stop"  # the stop token before the length


def test_a_speculator_without_a_proposer_does_nothing(tokenizer: ChatTokenizer) -> None:
    seq = _seq(tokenizer, "r0", [5, 6], SamplingParams(max_tokens=8))
    seq.output_token_ids, seq.num_computed_tokens, seq.status = [7], 2, Status.RUNNING
    speculator = Speculator(SpecConfig(), None, EngineCounters())
    speculator.propose([seq])
    speculator.forget([seq])
    assert seq.draft_token_ids == [] and seq.backoff is None
