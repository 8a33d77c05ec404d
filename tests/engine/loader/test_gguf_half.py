"""A GGUF file's F16 and BF16 matrices held as float16 / bfloat16, not widened to float32: every value
gguf's own dequantization, half the bytes, and the model's tokens and logprob bits those of the same
model with its weights widened to float32 through the float32 kernels (the 16-bit linears widen each
weight in registers, exactly, and keep the float32 chain's order)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from engine import kernels
from engine.config import EngineConfig
from engine.layers.linear import LinearWeight
from engine.llm_engine import Engine
from engine.loader import LoadedModel, load_config, load_model
from engine.models.held_weights import held_weight_bytes
from engine.sampling_params import SamplingParams
from tests.engine.loader.test_gguf_types import ggufs_tensors
from tests.engine_runs import run_to_end

KINDS = {"F16": torch.float16, "BF16": torch.bfloat16}
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module", params=sorted(KINDS))
def half_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(type, path): fixtures/make_gguf.py's small Llama with its matrices in F16 or BF16."""
    from fixtures.make_gguf import write_f32

    path = tmp_path_factory.mktemp("gguf") / f"llama-{request.param.lower()}.gguf"
    write_f32(path, request.param)
    return request.param, path


def _widened(loaded: LoadedModel) -> LoadedModel:
    """The same model with every weight widened to float32 and held so (no 16-bit weight left)."""
    weights = {name: w.float() if isinstance(w, torch.Tensor) else w for name, w in loaded.weights.items()}
    config = dataclasses.replace(loaded.config, half_weights=())
    return dataclasses.replace(loaded, config=config, weights=weights)


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (1, 6, 33, 70)]


def test_the_matrices_load_16_bit_with_ggufs_values(half_gguf: tuple[str, Path]):
    kind, path = half_gguf
    loaded = load_model(path)
    matrices = 0
    for name, shape, expected in ggufs_tensors(path, loaded.config):
        weight = loaded.weights[name]
        assert isinstance(weight, torch.Tensor)
        assert weight.dtype == (KINDS[kind] if len(shape) == 2 else torch.float32), name
        assert torch.equal(weight.float(), expected), name
        matrices += len(shape) == 2
    assert len(loaded.config.half_weights) == matrices == 2 * 7 + 2
    assert {t for _, t in loaded.config.half_weights} == {kind}


def test_the_engine_holds_them_16_bit_and_computes_the_widened_models_bits(half_gguf: tuple[str, Path]):
    kind, path = half_gguf
    loaded = load_model(path)
    engine = Engine(loaded, EngineConfig(num_kv_blocks=64))
    model = engine._model  # pylint: disable=protected-access
    for key, lw in model.linears.items():
        assert isinstance(lw, LinearWeight) and lw.data.dtype == KINDS[kind], key
        assert lw.nbytes == lw.data.numel() * 2
    assert model.w["model.embed_tokens.weight"].dtype == KINDS[kind]
    assert model.dtype == torch.float32  # the activations stay float32
    held = engine.snapshot().weight_bytes
    assert held == held_weight_bytes(load_config(path), "float32")
    wide = Engine(_widened(loaded), EngineConfig(num_kv_blocks=64))
    wide_model = wide._model  # pylint: disable=protected-access
    assert all(lw.data.dtype == torch.float32 for lw in wide_model.linears.values())
    norms = sum(t.numel() * 4 for name, t in model.w.items() if name != "model.embed_tokens.weight")
    assert held - norms == (wide.snapshot().weight_bytes - norms) // 2
    layer_loop = kernels.has_decoder_stack()  # the C++ layer loop reads the 16-bit panels too
    assert model.runs_decoder_stack(engine._kv) == layer_loop  # pylint: disable=protected-access
    prompts = _prompts(loaded.config.vocab_size)
    ours = run_to_end(engine, prompts, GREEDY, True)
    assert ours == run_to_end(wide, prompts, GREEDY, True)  # tokens and logprob bits
    assert ours == run_to_end(engine, prompts, GREEDY, False)  # batch invariance


def test_the_layer_loop_and_the_layer_by_layer_path_agree(half_gguf: tuple[str, Path]):
    _, path = half_gguf
    loaded = load_model(path)
    prompts = _prompts(loaded.config.vocab_size)
    fused = Engine(loaded, EngineConfig(num_kv_blocks=64))
    apart = Engine(loaded, EngineConfig(num_kv_blocks=64))
    apart._model.fused_layers = False  # pylint: disable=protected-access
    assert run_to_end(fused, prompts, GREEDY, True) == run_to_end(apart, prompts, GREEDY, True)
