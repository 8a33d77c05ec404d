"""The C++ layer loop (engine/kernels/csrc/decoder.h): one call runs every decoder layer of a step, and
its tokens and logprob bits are those of the layer-by-layer path, whatever the batch holds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine import kernels, testing
from engine.config import EngineConfig
from engine.llm_engine import Engine
from engine.loader import LoadedModel, load_model
from engine.sampling_params import SamplingParams

GGUF_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "gguf"
needs_compiled = pytest.mark.skipif(kernels.backend().module is None, reason="the C++ kernels are not built")


def _packed(gen: torch.Generator, n: int, k: int) -> torch.Tensor:
    """A random [n, k] linear weight in the kernels' packed float layout."""
    return kernels.pack_linear_weight(torch.randn(n, k, generator=gen) / k**0.5)


def _staggered_run(engine: Engine, vocab: int, seed: int) -> list[tuple[list[int], list[float]]]:
    """Requests of mixed lengths joining at different steps (prefill chunks beside decodes), greedy and
    seeded sampling: each request's tokens and logprobs."""
    rng = random.Random(seed)
    arrivals = {0: 2, 2: 1, 5: 2}
    finals: dict[str, tuple[list[int], list[float]]] = {}
    ids: list[str] = []
    step = 0
    while step < 6 or engine.has_unfinished():
        for _ in range(arrivals.get(step, 0)):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.choice((1, 7, 40, 70)))]
            temperature = rng.choice((0.0, 0.8))
            params = SamplingParams(
                max_tokens=rng.randrange(4, 14), temperature=temperature, seed=rng.randrange(99), logprobs=0,
                ignore_eos=True,
            )  # fmt: skip
            ids.append(engine.add_request(prompt, params))
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = (out.token_ids, out.logprobs)
        step += 1
    assert sorted(finals) == sorted(ids)
    return [finals[i] for i in ids]


def _both_paths(engine: Engine, vocab: int, seed: int):
    fused = _staggered_run(engine, vocab, seed)
    assert testing.ran_decoder_stack(engine)
    with testing.layer_by_layer(engine):
        layered = _staggered_run(engine, vocab, seed)
        assert not testing.ran_decoder_stack(engine)
    return fused, layered


@needs_compiled
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_one_call_for_every_layer_gives_the_layer_by_layer_bits(tiny_loaded: LoadedModel, quantize: str):
    engine = Engine(tiny_loaded, EngineConfig(quantize=quantize, num_kv_blocks=64, prefill_chunk=32))
    fused, layered = _both_paths(engine, tiny_loaded.config.vocab_size, seed=3)
    assert fused == layered
    assert any(lp for _, lp in fused)


@needs_compiled
@pytest.mark.parametrize("activations", ["float", "mixed"])
def test_a_linear_held_in_segments_of_two_types_gives_the_same_bits_either_way(activations: str):
    """llama-q4_k_m's second layer holds q|k|v as a Q4_K and a Q6_K segment (SegmentedLinear): the C++
    loop runs them as segments (split_linear), with the layer-by-layer path's bits, context rows too."""
    loaded = load_model(GGUF_DIR / "llama-q4_k_m.gguf")
    config = EngineConfig(activations=activations, num_kv_blocks=64, prefill_chunk=32)
    engine = Engine(loaded, config)
    fused, layered = _both_paths(engine, loaded.config.vocab_size, seed=5)
    assert fused == layered


@needs_compiled
@pytest.mark.smollm2
def test_the_shipped_quantized_model_gives_the_same_bits_either_way(smollm2_loaded: LoadedModel):
    engine = Engine(smollm2_loaded, EngineConfig(num_kv_blocks=64, prefill_chunk=48))
    fused, layered = _both_paths(engine, smollm2_loaded.config.vocab_size, seed=4)
    assert fused == layered


@needs_compiled
def test_a_replaced_weight_reaches_the_layer_loop(tiny_loaded: LoadedModel):
    engine = Engine(tiny_loaded, EngineConfig(num_kv_blocks=64))
    before = _staggered_run(engine, tiny_loaded.config.vocab_size, seed=5)
    testing.perturb_weight(engine, "model.layers.0.self_attn.v_proj.weight", delta=5.0, index=7)
    testing.perturb_weight(engine, "model.layers.1.input_layernorm.weight", delta=3.0, index=2)
    fused, layered = _both_paths(engine, tiny_loaded.config.vocab_size, seed=5)
    assert fused == layered
    assert fused != before


def test_elsewhere_the_layers_run_one_by_one(tiny_loaded: LoadedModel):
    """bfloat16, fast mode and an active fault take the Python layer loop (none is what the stack computes)."""
    prompt = [5, 6, 7, 8]
    for config in (EngineConfig(dtype="bfloat16"), EngineConfig(batch_invariant=False)):
        engine = Engine(tiny_loaded, config)
        engine.add_request(prompt, SamplingParams(max_tokens=2))
        engine.step()
        assert not testing.ran_decoder_stack(engine)
    engine = Engine(tiny_loaded, EngineConfig())
    with testing.batch_dependent_norm(engine):
        engine.add_request(prompt, SamplingParams(max_tokens=2))
        engine.step()
        assert not testing.ran_decoder_stack(engine)


@needs_compiled
def test_every_instruction_set_and_thread_count_gives_the_same_stack_bits():
    hidden, heads, kv_heads, d, inter, blocks, block = 64, 4, 2, 16, 96, 6, 4
    gen = torch.Generator().manual_seed(9)
    module = kernels.backend().module
    isas = kernels.compiled_isas()

    weights = [
        (torch.rand(hidden, generator=gen) + 0.5, _packed(gen, (heads + 2 * kv_heads) * d, hidden), _packed(gen, hidden, heads * d),
         torch.rand(hidden, generator=gen) + 0.5, _packed(gen, 2 * inter, hidden), _packed(gen, hidden, inter))
        for _ in range(2)
    ]  # fmt: skip
    family_parts = (
        torch.randn((heads + 2 * kv_heads) * d, generator=gen),  # a q/k/v bias (Qwen2)
        torch.rand(d, generator=gen) + 0.5,  # per-head q and k norms (Qwen3)
        torch.rand(d, generator=gen) + 0.5,
    )
    x = torch.randn(7, hidden, generator=gen)
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 5])  # a 5-token prefill, a first token, a decode
    owners = torch.tensor([0, 0, 0, 0, 0, 1, 2])
    tables = torch.tensor([[0, 1], [2, 0], [3, 4]])
    slots = torch.stack(
        [tables[o, p // block] * block + p % block for o, p in zip(owners, positions, strict=True)]
    )
    angles = positions[:, None].float() * torch.linspace(0.1, 1.0, d)[None]
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for isa in isas:
                caches = [torch.zeros(blocks, kv_heads, block, d) for _ in range(4)]
                for cache in caches:  # request 2's earlier keys and values, already in the pool
                    cache[3], cache[4] = 0.25, -0.5
                stack = module.DecoderStack(
                    hidden, heads, kv_heads, d, inter, 1e-5, d**-0.5, 3
                )  # a 3-key window
                for layer, (n1, qkv, o, n2, gate_up, down) in enumerate(weights):
                    k, v = caches[2 * layer], caches[2 * layer + 1]
                    extras = family_parts if layer == 0 else (torch.empty(0),) * 3  # bias, q norm, k norm
                    no_scales = (torch.empty(0),) * 2  # float caches
                    stack.add_layer(
                        n1, qkv, -1, o, -1, n2, gate_up, -1, down, -1, k, v, *no_scales, *extras, []
                    )
                out = stack.forward(isa, x, slots, angles.cos(), angles.sin(), tables, owners, positions, 0)
                results.append((out, *caches))
    finally:
        torch.set_num_threads(threads)
    assert stack.num_layers == 2
    assert torch.isfinite(results[0][0]).all() and not torch.equal(results[0][0], x)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


@needs_compiled
def test_the_stack_returns_only_the_rows_before_the_context_rows():
    """forward(..., C) -> [N - C, hidden]: the leading rows, each the bits it has with C = 0, and every
    row's K/V (the context rows' too) the same either way."""
    hidden, heads, kv_heads, d, inter, blocks, block = 32, 2, 1, 16, 48, 4, 4
    gen = torch.Generator().manual_seed(3)
    module = kernels.backend().module

    norm = torch.rand(hidden, generator=gen) + 0.5
    weights = [(_packed(gen, (heads + 2 * kv_heads) * d, hidden), _packed(gen, hidden, heads * d), _packed(gen, 2 * inter, hidden),
                _packed(gen, hidden, inter)) for _ in range(2)]  # fmt: skip
    # rows: a decode of request 1, then request 0's last prompt token and its four context rows
    positions = torch.tensor([2, 4, 0, 1, 2, 3])
    owners = torch.tensor([1, 0, 0, 0, 0, 0])
    tables = torch.tensor([[0, 1], [2, 3]])
    slots = torch.stack(
        [tables[o, p // block] * block + p % block for o, p in zip(owners, positions, strict=True)]
    )
    angles = positions[:, None].float() * torch.linspace(0.1, 1.0, d)[None]
    x = torch.randn(6, hidden, generator=gen)
    runs = []
    for context_rows in (0, 4):
        caches = [torch.zeros(blocks, kv_heads, block, d) for _ in range(4)]
        stack = module.DecoderStack(hidden, heads, kv_heads, d, inter, 1e-5, d**-0.5, 0)
        for layer, (qkv, o, gate_up, down) in enumerate(weights):
            none = torch.empty(0)
            k, v = caches[2 * layer], caches[2 * layer + 1]
            stack.add_layer(
                norm, qkv, -1, o, -1, norm, gate_up, -1, down, -1, k, v, none, none, none, none, none, []
            )
        args = (x, slots, angles.cos(), angles.sin(), tables, owners, positions, context_rows)
        runs.append((stack.forward(kernels.backend().name, *args), caches))
    (full, full_caches), (narrowed, narrowed_caches) = runs
    assert full.shape == (6, hidden) and narrowed.shape == (2, hidden)
    assert torch.equal(narrowed, full[:2])
    assert all(torch.equal(a, b) for a, b in zip(full_caches, narrowed_caches, strict=True))
