"""What the KV pool holds (EngineConfig.kv_cache_dtype): float16 under quantized weights by default (the
model's dtype on the float path, which stays exact), a dtype by name, bad pairings refused; footprints
count the pool the engine allocates; a float16 pool keeps each request's bits its own."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, kv_cache_dtype
from engine.errors import InvalidRequestError
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.mux.footprint import footprint_of_spec
from engine.mux.registry import ModelSpec, RegistryError, parse_registry
from engine.sampling_params import SamplingParams
from engine.settings import EngineSettings


def test_auto_is_float16_under_quantized_weights_and_the_model_dtype_on_the_float_path(
    tiny_loaded: LoadedModel,
):
    quantized = Engine(tiny_loaded, EngineConfig(quantize="int8", num_kv_blocks=8))
    plain = Engine(tiny_loaded, EngineConfig(num_kv_blocks=8))
    assert quantized.kv_dtype == torch.float16
    assert plain.kv_dtype == torch.float32
    assert 2 * quantized.snapshot().kv_bytes == plain.snapshot().kv_bytes
    forced = Engine(tiny_loaded, EngineConfig(quantize="int8", kv_cache_dtype="float32", num_kv_blocks=8))
    assert forced.kv_dtype == torch.float32
    assert Engine(tiny_loaded, EngineConfig(dtype="bfloat16", quantize="int8", num_kv_blocks=8)).kv_dtype == (
        torch.bfloat16
    )


def test_the_rule_and_its_refusals():
    assert kv_cache_dtype("auto", torch.float32, holds_quantized=True) == torch.float16
    assert kv_cache_dtype("auto", torch.float32, holds_quantized=False) == torch.float32
    assert kv_cache_dtype("float16", torch.float32, holds_quantized=False) == torch.float16
    for bad in ({"kv_cache_dtype": "fp8"}, {"dtype": "bfloat16", "kv_cache_dtype": "float16"},
                {"dtype": "float16", "kv_cache_dtype": "float32"}):  # fmt: skip
        with pytest.raises(InvalidRequestError, match="kv_cache_dtype"):
            EngineConfig(**bad)
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype"):
        EngineSettings(kv_cache_dtype="q8_0")
    with pytest.raises(RegistryError, match="kv_cache_dtype"):
        parse_registry({"model": [{"id": 0, "name": "t", "source": "tiny", "kv_cache_dtype": "q8_0"}]})


@pytest.mark.parametrize(
    "quantize,kv", [("int8", "auto"), ("none", "auto"), ("int8", "float32"), ("none", "float16")]
)
def test_footprints_count_the_pool_the_engine_allocates(tiny_loaded: LoadedModel, quantize: str, kv: str):
    engine = Engine(tiny_loaded, EngineConfig(quantize=quantize, kv_cache_dtype=kv, num_kv_blocks=8))
    settings = EngineSettings(quantize=quantize, kv_cache_dtype=kv, num_kv_blocks=8)
    spec = ModelSpec(0, "t", source="tiny", engine=settings, activation_bytes=0)
    assert footprint_of_spec(spec).kv_bytes == engine.snapshot().kv_bytes


def _run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return [done[i] for i in ids]


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_a_float16_pool_keeps_each_request_its_solo_bits(tiny_loaded: LoadedModel, quantize: str):
    config = EngineConfig(quantize=quantize, kv_cache_dtype="float16", num_kv_blocks=32, prefill_chunk=16)
    prompts = [[5 + i, 9, 40 + 3 * i, 7] * (1 + i) for i in range(5)]
    together = _run(Engine(tiny_loaded, config), prompts)
    for prompt, tokens in zip(prompts, together, strict=True):
        assert _run(Engine(tiny_loaded, config), [prompt]) == [tokens]
