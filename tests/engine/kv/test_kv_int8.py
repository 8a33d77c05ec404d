"""An int8 KV pool (--kv-cache-dtype int8, engine/kv/int8.py): about half a float16 pool's bytes, each
request's bits its own (batched or alone, through the prefix cache, after preemption by recompute), the
C++ layer loop and the layer-by-layer path writing and reading the same values; refused where it cannot run."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.kv.cache import KVCache
from engine.llm_engine import Engine
from engine.loader import LoadedModel
from engine.mux.footprint import footprint_of_spec
from engine.mux.registry import ModelSpec
from engine.sampling_params import SamplingParams
from engine.settings import EngineSettings
from engine.testing import layer_by_layer, ran_decoder_stack


def _run(engine: Engine, prompts: list[list[int]], max_tokens: int = 12) -> list[tuple[list[int], list]]:
    """Each prompt's greedy tokens and their logprob entries, in prompt order."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.token_ids, out.logprobs)
    return [done[i] for i in ids]


def _config(**overrides) -> EngineConfig:
    return EngineConfig(**({"kv_cache_dtype": "int8", "num_kv_blocks": 48, "prefill_chunk": 16} | overrides))


PROMPTS = [[5 + i, 9, 40 + 3 * i, 7] * (2 + 3 * i) for i in range(5)]


def test_an_int8_pool_holds_about_half_the_bytes_and_the_footprint_counts_them(tiny_loaded: LoadedModel):
    int8_engine = Engine(tiny_loaded, _config())
    float16 = Engine(tiny_loaded, _config(kv_cache_dtype="float16"))
    assert int8_engine.kv_dtype == torch.int8
    c = tiny_loaded.config  # head_dim 16: one float16 scale per 16 values
    assert int8_engine.snapshot().kv_bytes == 48 * 16 * 2 * c.num_layers * c.num_kv_heads * (c.head_dim + 2)
    assert int8_engine.snapshot().kv_bytes < 0.6 * float16.snapshot().kv_bytes
    settings = EngineSettings(kv_cache_dtype="int8", num_kv_blocks=48)
    spec = ModelSpec(0, "t", source="tiny", engine=settings, activation_bytes=0)
    assert footprint_of_spec(spec).kv_bytes == int8_engine.snapshot().kv_bytes


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_each_request_keeps_its_solo_bits_and_both_paths_agree(tiny_loaded: LoadedModel, quantize: str):
    """Batched == alone (token ids and logprobs), in the C++ layer loop and layer by layer (torch quantizes
    the writes there, engine/kv/int8.py; the C++ loop in kv_int8.h): the same bits."""
    engine = Engine(tiny_loaded, _config(quantize=quantize))
    together = _run(engine, PROMPTS)
    assert ran_decoder_stack(engine)
    for prompt, result in zip(PROMPTS, together, strict=True):
        assert _run(Engine(tiny_loaded, _config(quantize=quantize)), [prompt]) == [result]
    slow = Engine(tiny_loaded, _config(quantize=quantize))
    with layer_by_layer(slow):
        assert _run(slow, PROMPTS) == together
        assert not ran_decoder_stack(slow)


def test_prefix_cache_hits_and_preemption_keep_the_bits(tiny_loaded: LoadedModel):
    """A request whose prompt's blocks come from the prefix cache, and requests preempted by recompute in a
    tight pool, answer as they do alone on a fresh engine."""
    shared = [11, 12, 13, 14] * 12
    prompts = [shared + [20 + i, 30 + i] for i in range(4)]
    alone = [_run(Engine(tiny_loaded, _config()), [p], 24)[0] for p in prompts]
    warm = Engine(tiny_loaded, _config())
    _run(warm, prompts[:1], 24)
    assert _run(warm, prompts[1:2], 24) == alone[1:2]
    assert warm.snapshot().prefix_hits > 0
    tight = Engine(tiny_loaded, _config(num_kv_blocks=8, max_num_seqs=4))
    assert _run(tight, prompts, 24) == alone
    assert tight.snapshot().counters.preemptions > 0


def test_int8_is_refused_where_it_cannot_run(tiny_loaded: LoadedModel):
    with pytest.raises(InvalidRequestError, match="int8 needs a float32 model"):
        EngineConfig(dtype="bfloat16", kv_cache_dtype="int8")
    with pytest.raises(InvalidRequestError, match="CPU kernels only"):
        KVCache(tiny_loaded.config, 4, 16, torch.int8, torch.device("meta"))


def test_smollm2_keeps_its_solo_bits_on_an_int8_pool(smollm2_loaded: LoadedModel):
    """On the shipped model (head_dim 64: two scales a head), through the decoder stack, chunks of 16."""
    prompts = [[1, 9690, 198] + [200 + 7 * i] * (5 + 9 * i) for i in range(3)]
    config = _config(num_kv_blocks=16)
    together = _run(Engine(smollm2_loaded, config), prompts, 8)
    for prompt, result in zip(prompts, together, strict=True):
        assert _run(Engine(smollm2_loaded, config), [prompt], 8) == [result]
