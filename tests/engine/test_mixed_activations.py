"""activations="mixed": int16 inputs, except the o, gate_up and down inputs of a prompt's context rows
(its tokens before the last: rows that only write K/V), which are int8. Which rows are context depends
on the request alone, so batch invariance holds in a batch, after a preemption and through the prefix
cache; a request's own rows (its last prompt token, its decodes) are computed as under "int16"."""

from __future__ import annotations

import random

import pytest
import torch

from engine import kernels
from engine.config import EngineConfig
from engine.kernels.quant_pack import DOT, WIDE
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.model_runner import RowSpan, lay_out
from engine.models.decoder_layer import stack_arguments
from engine.sampling_params import SamplingParams
from tests.engine_runs import run_to_end

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=0)


def _engine(loaded: LoadedModel, activations: str = "mixed", **overrides) -> Engine:
    config = EngineConfig(
        **{"quantize": "int8", "activations": activations, "num_kv_blocks": 64, **overrides}
    )
    return Engine(loaded, config)


def _prompts(vocab: int, seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def test_context_rows_take_int8_except_in_q_k_v(tiny_loaded: LoadedModel):
    linears = _engine(tiny_loaded)._model.linears
    for key, lw in linears.items():
        if not lw.quantized:
            continue
        assert WIDE <= lw.format < WIDE + DOT, key  # int16 inputs for a request's own rows
        int8_context = key.endswith(("o_proj.weight", "gate_up", "down_proj.weight"))
        assert lw.context_format == (lw.format - DOT if int8_context else lw.format), key


def test_only_context_rows_differ_from_int16(tiny_loaded: LoadedModel):
    """A one-token prompt has no context row: its run is the int16 run, bit for bit. Longer prompts'
    context rows are int8, so their logprobs move off the int16 ones."""
    prompts = _prompts(tiny_loaded.config.vocab_size, 2, (1, 9, 40, 77))
    mixed = run_to_end(_engine(tiny_loaded), prompts, GREEDY)
    int16 = run_to_end(_engine(tiny_loaded, "int16"), prompts, GREEDY)
    assert mixed[0] == int16[0]
    assert all(mixed[i][1] != int16[i][1] for i in (1, 2, 3))


def test_batches_and_the_layer_by_layer_path_give_the_solo_bits(tiny_loaded: LoadedModel):
    prompts = _prompts(tiny_loaded.config.vocab_size, 3, (2, 17, 33, 64, 90))
    engine = _engine(tiny_loaded, prefill_chunk=32)
    together = run_to_end(engine, prompts, GREEDY, together=True)
    assert engine._model.last_forward_fused
    assert together == run_to_end(engine, prompts, GREEDY, together=False)
    layered = _engine(tiny_loaded, prefill_chunk=32)
    layered._model.fused_layers = False
    assert together == run_to_end(layered, prompts, GREEDY, together=True)
    assert not layered._model.last_forward_fused


def test_a_preempted_request_recomputes_its_own_rows_as_its_own(tiny_loaded: LoadedModel):
    """Preemption frees a request's blocks; it comes back with its decoded tokens as prompt-like rows
    to recompute. They are past its prompt, so they are recomputed in int16, as they were decoded."""
    prompts = _prompts(tiny_loaded.config.vocab_size, 4, (40, 45, 50, 55))
    params = SamplingParams(max_tokens=40, ignore_eos=True, logprobs=0)
    short = _engine(tiny_loaded, num_kv_blocks=14, max_num_seqs=4)
    squeezed = run_to_end(short, prompts, params, together=True)
    assert short.counters.preemptions >= 1
    assert squeezed == run_to_end(_engine(tiny_loaded), prompts, params, together=False)


def _follow_up(loaded: LoadedModel, hash_context: bool) -> tuple[tuple, tuple, int]:
    """A request, then one whose prompt is its prompt, its reply and more (a chat's next turn), on one
    engine with the prefix cache; and the second alone on a fresh engine. ``hash_context`` False: the
    scheduler's block hashes leave out which rows were context."""
    first = _prompts(loaded.config.vocab_size, 5, (40,))[0]
    params = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=0)
    engine = _engine(loaded)
    if not hash_context:
        engine._scheduler.context_keyed = False
    reply = run_to_end(engine, [first], params)[0][0]
    follow_up = first + reply + [7, 8, 9]
    hits_before = engine.snapshot().prefix_hits
    after = run_to_end(engine, [follow_up], GREEDY)[0]
    alone = run_to_end(_engine(loaded), [follow_up], GREEDY)[0]
    return after, alone, engine.snapshot().prefix_hits - hits_before


def test_the_prefix_cache_never_serves_a_reply_block_as_context(tiny_loaded: LoadedModel):
    """The first request's blocks past its prompt hold rows computed as its own (int16); the next turn
    reads those positions as context (int8). Block hashes carry the context count, so only the blocks
    wholly inside the first prompt's context are reused, and the next turn gets its solo bits."""
    assert not _engine(tiny_loaded, "int16")._scheduler.context_keyed  # int16 rows are alike: no count
    after, alone, hits = _follow_up(tiny_loaded, hash_context=True)
    assert after == alone
    assert hits == 2  # block size 16: positions 0..31 lie before the first prompt's last token (39)


def test_without_the_context_count_the_prefix_cache_breaks_invariance(tiny_loaded: LoadedModel):
    """The negative control: hashing tokens alone hands the reply's int16 blocks to the next turn."""
    after, alone, hits = _follow_up(tiny_loaded, hash_context=False)
    assert hits > 2
    assert after != alone


def test_lay_out_puts_context_rows_last_and_keeps_sample_rows():
    table = list(range(8))
    spans = [
        RowSpan([1, 2, 3, 4, 5], 0, table, 0, context=True),
        RowSpan([6], 9, table, 1),
        RowSpan([7, 8, 9], 16, table, 0, context=True),
        RowSpan([10, 11], 19, table, 1),
    ]
    batch, last = lay_out(spans, 16, torch.device("cpu"))
    assert batch.context_rows == 8
    assert batch.token_ids.tolist() == [6, 10, 11, 1, 2, 3, 4, 5, 7, 8, 9]
    assert batch.positions.tolist() == [9, 19, 20, 0, 1, 2, 3, 4, 16, 17, 18]
    assert batch.sample_rows.tolist() == [0, 2]
    assert last == [-1, 0, -1, 1]


def test_the_layer_loop_refuses_context_arguments_it_cannot_honour(tiny_loaded: LoadedModel):
    if kernels.backend().module is None:
        pytest.skip("the portable backend has no C++ layer loop")
    engine = _engine(tiny_loaded)
    model, kv, c = engine._model, engine._kv, tiny_loaded.config
    record = model.layers[0]
    qkv, o, gate_up, down = record.qkv, record.o, record.gate_up, record.down
    stack = kernels.decoder_stack(
        c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps, 1.0
    )
    *layer, context_formats = stack_arguments(record, kv.keys[0], kv.values[0])
    assert context_formats == [qkv.format, o.context_format, gate_up.context_format, down.context_format]
    with pytest.raises(RuntimeError, match="context format"):  # int8 layout read as another format
        stack.add_layer(*layer, [qkv.format, o.format - 2, gate_up.format, down.format])
    stack.add_layer(*layer, context_formats)
    rows = torch.zeros(2, c.head_dim)
    args = (torch.tensor([0, 1]), rows, rows, torch.tensor([[0]]), torch.tensor([0, 0]), torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="context rows"):
        kernels.decoder_forward(stack, torch.zeros(2, c.hidden_size), *args, context_rows=3)
    for context in (0, 1, 2):  # the context rows write their K/V and leave the result
        out = kernels.decoder_forward(stack, torch.zeros(2, c.hidden_size), *args, context_rows=context)
        assert out.shape == (2 - context, c.hidden_size)


def test_the_layer_by_layer_path_attends_only_for_rows_past_the_last_layer(
    tiny_loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
):
    """The last layer's attention runs for a step's own rows alone (context rows only write K/V
    there), and the tokens are the fused stack's."""
    prompt = _prompts(tiny_loaded.config.vocab_size, 5, (40,))
    params = SamplingParams(max_tokens=3, ignore_eos=True, logprobs=0)
    fused = run_to_end(_engine(tiny_loaded, prefill_chunk=32), prompt, params)
    layered = _engine(tiny_loaded, prefill_chunk=32)
    layered._model.fused_layers = False
    rows_seen: list[int] = []
    real = kernels.attention

    def counting(q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows_seen.append(q.shape[0])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(kernels, "attention", counting)
    assert run_to_end(layered, prompt, params) == fused
    layers = tiny_loaded.config.num_layers
    steps = [rows_seen[i : i + layers] for i in range(0, len(rows_seen), layers)]
    # a chunk of 32 context rows, then 7 context rows and the last prompt token, then two decodes
    assert [(s[0], s[-1]) for s in steps] == [(32, 0), (8, 1), (1, 1), (1, 1)]
    assert all(len(set(s[:-1])) == 1 for s in steps)
