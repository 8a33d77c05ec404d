"""Quantized weights through the whole engine: a GGUF's blocks kept as they are (``quantize="auto"``),
float weights quantized at load (``"int8"``), or everything dequantized (``"none"``).

The quantized path computes with exactly the dequantized values, so its tokens and logprob bits are
the float path's over the same dequantized weights, and batch invariance carries over.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.kernels.quant_pack import DOT, WIDE
from engine.llm import LLM
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.models.held_weights import held_weight_bytes
from engine.quantized import QuantizedWeight, quantize_q8_0
from engine.sampling_params import SamplingParams
from tests.engine_runs import run_to_end

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=0)


def _prompts(vocab: int, seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def _run(engine: Engine, prompts: list[list[int]], together: bool) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and logprobs, all in one batch or each alone."""
    return run_to_end(engine, prompts, GREEDY, together)


def _as_q8_0_floats(loaded: LoadedModel) -> LoadedModel:
    """The model with every linear weight replaced by its Q8_0 round trip, as float32."""
    weights = {
        name: quantize_q8_0(w).dequantize() if name.endswith("proj.weight") or name == "lm_head.weight" else w
        for name, w in loaded.dense_weights().items()
    }
    return dataclasses.replace(loaded, weights=dict(weights))


def test_int8_gives_the_float_paths_bits_over_the_same_values(tiny_loaded: LoadedModel):
    prompts = _prompts(tiny_loaded.config.vocab_size, 1, (1, 9, 40, 77))
    quantized = Engine(tiny_loaded, EngineConfig(quantize="int8", activations="float", num_kv_blocks=64))
    # the quantized run's cache is float16 (kv_cache_dtype auto); the float run's set to match
    floats_config = EngineConfig(quantize="none", kv_cache_dtype="float16", num_kv_blocks=64)
    floats = Engine(_as_q8_0_floats(tiny_loaded), floats_config)
    plain = Engine(tiny_loaded, EngineConfig(quantize="none", num_kv_blocks=64))
    assert quantized.snapshot().weight_bytes < plain.snapshot().weight_bytes / 2
    ours = _run(quantized, prompts, together=True)
    assert ours == _run(floats, prompts, together=True)
    assert ours == _run(quantized, prompts, together=False)  # batch invariance, bit for bit
    assert ours != _run(plain, prompts, together=True)  # it really ran on other weights


@pytest.mark.parametrize(
    ("dtype", "quantize", "invariant"),
    [
        ("float32", "auto", True),
        ("bfloat16", "int8", True),
        ("float16", "none", True),
        ("float32", "int8", False),
    ],
)
def test_held_weight_bytes_counts_what_the_engine_holds(tiny_loaded: LoadedModel, dtype, quantize, invariant):
    config = EngineConfig(dtype=dtype, quantize=quantize, batch_invariant=invariant, num_kv_blocks=8)
    engine = Engine(tiny_loaded, config)
    expected = held_weight_bytes(tiny_loaded.config, dtype, quantize, invariant)
    assert engine.snapshot().weight_bytes == expected


def test_quantize_mode_is_checked():
    with pytest.raises(InvalidRequestError, match="quantize mode"):
        EngineConfig(quantize="int4")


def test_activations_mode_is_checked():
    with pytest.raises(InvalidRequestError, match="activations"):
        EngineConfig(activations="fp8")


@pytest.mark.parametrize(("activations", "first_format"), [("int8", DOT), ("int16", WIDE)])
def test_integer_activations_keep_batch_invariance_and_really_quantize_the_inputs(
    tiny_loaded: LoadedModel, activations: str, first_format: int
):
    """activations="int8" / "int16": each row's inputs quantized per 32 (csrc/qdot.h). A request's
    tokens and logprob bits are its solo run's in a batch; they are not the float activations' bits."""
    prompts = _prompts(tiny_loaded.config.vocab_size, 4, (1, 9, 40, 77))
    ints = Engine(tiny_loaded, EngineConfig(quantize="int8", activations=activations, num_kv_blocks=64))
    floats = Engine(tiny_loaded, EngineConfig(quantize="int8", activations="float", num_kv_blocks=64))
    formats = {lw.format for lw in ints._model.linears.values() if lw.quantized}
    assert (
        formats and min(formats) >= first_format and max(formats) < first_format + DOT
    )  # every one in its layout
    ours = _run(ints, prompts, together=True)
    assert ours == _run(ints, prompts, together=False)
    assert [logprobs for _, logprobs in ours] != [
        logprobs for _, logprobs in _run(floats, prompts, together=True)
    ]


def test_int8_leaves_widths_it_cannot_block_as_float(tiny_loaded: LoadedModel):
    """K not a multiple of 32 cannot be Q8_0: such a weight stays float (and the model still runs)."""
    config = dataclasses.replace(tiny_loaded.config, intermediate_size=120)
    weights = dict(tiny_loaded.weights)
    for n in range(config.num_layers):
        p = f"model.layers.{n}.mlp."
        for name in ("gate_proj", "up_proj"):
            weights[p + name + ".weight"] = torch.as_tensor(weights[p + name + ".weight"])[:120]
        weights[p + "down_proj.weight"] = torch.as_tensor(weights[p + "down_proj.weight"])[:, :120]
    engine = Engine(
        dataclasses.replace(tiny_loaded, config=config, weights=weights), EngineConfig(quantize="int8")
    )
    assert engine.snapshot().weight_bytes > 0
    assert len(_run(engine, _prompts(config.vocab_size, 2, (5,)), together=True)[0][0]) == 12


@pytest.mark.smollm2
def test_the_shipped_gguf_stays_quantized_and_matches_its_dequantized_run(smollm2_loaded: LoadedModel):
    weights = smollm2_loaded.weights
    layer_types = {w.qtype for n, w in weights.items() if isinstance(w, QuantizedWeight) and "layers" in n}
    assert layer_types == {"Q4_1"}
    embedding = weights["model.embed_tokens.weight"]
    assert isinstance(embedding, QuantizedWeight) and embedding.qtype == "Q8_0"
    file_bytes = smollm2_loaded.source.path.stat().st_size
    quantized = Engine(smollm2_loaded, EngineConfig(activations="float", num_kv_blocks=64))
    assert quantized.snapshot().weight_bytes < 1.25 * file_bytes
    assert quantized.snapshot().weight_bytes == held_weight_bytes(smollm2_loaded.config, "float32")
    prompts = _prompts(smollm2_loaded.config.vocab_size, 3, (3, 30))
    ours = _run(quantized, prompts, together=True)
    del quantized
    dense = Engine(smollm2_loaded, EngineConfig(quantize="none", kv_cache_dtype="float16", num_kv_blocks=64))
    assert dense.snapshot().weight_bytes > 4 * file_bytes
    assert dense.snapshot().weight_bytes == held_weight_bytes(smollm2_loaded.config, "float32", "none")
    assert ours == _run(dense, prompts, together=True)


def test_embed_reads_a_quantized_table(tiny_loaded: LoadedModel):
    """The embeddings endpoint's vectors from a quantized tied table equal those of its float values."""
    config = dataclasses.replace(tiny_loaded.config, tie_word_embeddings=True)
    weights = {k: v for k, v in tiny_loaded.weights.items() if k != "lm_head.weight"}
    tied = dataclasses.replace(tiny_loaded, config=config, weights=weights)
    quantized = Engine(tied, EngineConfig(quantize="int8", num_kv_blocks=16))
    table = quantize_q8_0(torch.as_tensor(weights["model.embed_tokens.weight"])).dequantize()
    expected = torch.nn.functional.normalize(table[[5, 9, 11]].mean(dim=0), dim=0)
    assert torch.equal(torch.tensor(quantized.embed([[5, 9, 11]])[0]), expected)


def test_llm_takes_the_mode():
    llm = LLM("tiny", quantize="int8", num_kv_blocks=16)
    assert llm.config.quantize == "int8"
    assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids
