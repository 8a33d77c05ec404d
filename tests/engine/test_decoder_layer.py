"""A decoder layer's weights as one record (engine/models/decoder_layer.py): built once at load from the
model's own tensors, rebuilt when a weight is replaced, shared by the paged model, the C++ stack's
hand-over and the reference; one predicate decides the C++ layer loop; one RMSNorm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import kernels, testing
from engine.config import EngineConfig
from engine.layers.rmsnorm import rms_norm
from engine.llm_engine import Engine
from engine.loader import LoadedModel, load_model
from engine.models.decoder_layer import DecoderLayerWeights
from engine.models.reference import ReferenceLlama

FAMILIES = Path(__file__).resolve().parents[2] / "fixtures" / "families"


def test_the_record_holds_the_models_own_tensors(tiny_loaded: LoadedModel):
    model = Engine(tiny_loaded, EngineConfig(num_kv_blocks=16))._model
    assert len(model.layers) == tiny_loaded.config.num_layers
    for n, layer in enumerate(model.layers):
        p = f"model.layers.{n}."
        assert layer.input_norm is model.weight(p + "input_layernorm.weight")
        assert layer.post_norm is layer.mlp_norm is model.weight(p + "post_attention_layernorm.weight")
        assert (
            layer.qkv is model.linears[p + "self_attn.qkv"]
            and layer.down is model.linears[p + "mlp.down_proj.weight"]
        )
        assert (layer.qkv_bias, layer.q_norm, layer.attention_output_norm, layer.mlp_output_norm) == (
            None,
        ) * 4


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3"])
def test_a_familys_parts_are_in_its_record(name: str):
    loaded = load_model(FAMILIES / name)
    layer = Engine(loaded, EngineConfig(num_kv_blocks=16))._model.layers[0]
    assert (layer.qkv_bias is not None) == (name == "qwen2")
    assert (layer.q_norm is not None) == (layer.k_norm is not None) == (name != "qwen2")
    assert layer.sandwich == (name == "gemma3")
    if layer.sandwich:  # Gemma: post_attention_layernorm norms the attention's output
        assert layer.attention_output_norm is layer.post_norm and layer.mlp_norm is layer.pre_feedforward_norm


def test_the_reference_reads_the_checkpoints_parts_through_the_same_record():
    loaded = load_model(FAMILIES / "qwen2")
    ref = ReferenceLlama(loaded.config, loaded.dense_weights(), torch.float32, torch.device("cpu"))
    w, c, layer = ref.w, loaded.config, ref.layers[1]
    p = "model.layers.1."
    assert all(t is w[p + f"self_attn.{x}_proj.weight"] for t, x in zip(layer.qkv, "qkv", strict=True))
    assert layer.o[0] is w[p + "self_attn.o_proj.weight"] and len(layer.o) == 1 and len(layer.gate_up) == 2
    assert layer.qkv_bias is not None
    for part, x in zip(layer.qkv_bias.split([c.q_size, c.kv_size, c.kv_size]), "qkv", strict=True):
        assert torch.equal(part, w[p + f"self_attn.{x}_proj.bias"])


def test_q_and_k_norms_come_together():
    norm = torch.ones(4)
    with pytest.raises(ValueError, match="q and k norms"):
        DecoderLayerWeights(norm, norm, None, None, None, None, q_norm=norm)


def test_a_replaced_norm_reaches_the_record(tiny_loaded: LoadedModel):
    engine = Engine(tiny_loaded, EngineConfig(num_kv_blocks=16))
    name = "model.layers.1.input_layernorm.weight"
    before = engine._model.weight(name).clone()
    testing.perturb_weight(engine, name, delta=3.0, index=2)
    assert engine._model.layers[1].input_norm is engine._model.weight(name)
    assert not torch.equal(engine._model.layers[1].input_norm, before)


def test_one_predicate_decides_the_layer_loop(tiny_loaded: LoadedModel):
    """float32 on the compiled CPU kernels, invariant, no fault, not Gemma: the C++ loop; else not."""
    compiled = kernels.has_decoder_stack()
    engine = Engine(tiny_loaded, EngineConfig(num_kv_blocks=16))
    model, kv = engine._model, engine._kv
    assert model.runs_decoder_stack(kv) == compiled
    with testing.layer_by_layer(engine):
        assert not model.runs_decoder_stack(kv)
    with testing.batch_dependent_matmul(engine):
        assert not model.runs_decoder_stack(kv)
    for config in (EngineConfig(dtype="bfloat16"), EngineConfig(batch_invariant=False)):
        other = Engine(tiny_loaded, config)
        assert not other._model.runs_decoder_stack(other._kv)
    gemma = Engine(load_model(FAMILIES / "gemma3"), EngineConfig(num_kv_blocks=16))
    assert not gemma._model.runs_decoder_stack(gemma._kv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (5, 576), (3, 4, 16), (17, 100)])
def test_torchs_rms_norm_is_the_formula_bit_for_bit(shape: tuple[int, ...], dtype: torch.dtype):
    """The reference's RMSNorm (torch's, invariant=False) gives the bits of x * rsqrt(mean(x^2) + eps),
    as transformers writes it."""
    gen = torch.Generator().manual_seed(len(shape) * 1000 + shape[-1])
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    weight = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    x32 = x.float()
    formula = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * weight
    assert torch.equal(rms_norm(x, weight, 1e-6, invariant=False), formula)
