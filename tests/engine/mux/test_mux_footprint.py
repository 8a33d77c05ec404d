"""Footprints computed from model files match the bytes a loaded engine really holds; the planner's sets."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError, UnknownModelError
from engine.loader import load_config
from engine.mux.footprint import Footprint, footprint_from_config, footprint_of, footprint_of_spec
from engine.mux.planner import plan_capacity
from engine.mux.registry import MB, ModelSpec, Registry
from engine.settings import EngineSettings


def test_tiny_footprint_by_hand() -> None:
    # tiny: 2 layers, hidden 64, 4 heads / 2 kv heads of 16, mlp 128, vocab 512, untied head
    f = footprint_of("tiny", "float32", num_kv_blocks=10, block_size=16, activation_bytes=MB)
    per_layer = 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    params = 512 * 64 + 2 * per_layer + 64 + 512 * 64
    assert f.num_params == params == 139_584
    assert f.weight_bytes == params * 4
    assert f.kv_bytes_per_block == 2 * 2 * 2 * 16 * 16 * 4 == 8192
    assert f.kv_bytes == 10 * 8192
    assert f.total_bytes == params * 4 + 10 * 8192 + MB
    assert f.context_tokens == 160


@pytest.mark.smollm2
def test_smollm2_footprint_in_bfloat16() -> None:
    f = footprint_of("smollm2", "bfloat16", 256, 16, 0, quantize="none")
    assert f.num_params == 134_515_008  # tied embeddings counted once
    assert f.weight_bytes == 134_515_008 * 2  # the tied head held once, its rows the lookup
    assert f.kv_bytes_per_block == 2 * 30 * 3 * 64 * 16 * 2
    # as shipped: Q4_1 layers in tiles of 16 x 32 weights (16 float16 scales, 16 mins, 256 bytes of
    # nibbles: GGUF's 20 bytes a block), the tied Q8_0 head once (16 scales, 512 bytes: 34 a block),
    # bfloat16 norms
    kept = footprint_of("smollm2", "bfloat16", 256, 16, 0)
    per_layer = 576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 * 1536
    q4_1 = 30 * per_layer // 32 * 20
    q8_0 = 49152 * 576 // 32 * 34
    assert kept.weight_bytes == q4_1 + q8_0 + (2 * 30 + 1) * 576 * 2


def test_footprint_matches_a_loaded_engine(tiny_llm) -> None:
    engine = tiny_llm.engine
    settings = EngineSettings(num_kv_blocks=engine.config.num_kv_blocks)
    spec = ModelSpec(0, "t", source="tiny", engine=settings, activation_bytes=0)
    f = footprint_of_spec(spec)
    snap = engine.snapshot()
    assert f.weight_bytes == snap.weight_bytes
    assert f.kv_bytes == snap.kv_bytes


def test_max_context_and_blocks() -> None:
    config = load_config("tiny")
    f = footprint_from_config(config, "float32", 4, 16, 0)
    room = 50 * 8192 + 100
    assert f.max_kv_blocks(f.weight_bytes + room) == 50
    assert f.max_context(f.weight_bytes + room) == 800
    assert f.max_context(f.weight_bytes + 10**9) == config.max_position_embeddings  # capped by positions
    assert f.max_context(f.weight_bytes - 1) == 0


def test_footprint_input_errors() -> None:
    config = load_config("tiny")
    with pytest.raises(InvalidRequestError, match="unsupported dtype"):
        footprint_from_config(config, "int8", 4, 16, 0)
    with pytest.raises(InvalidRequestError):
        footprint_from_config(config, "float32", 0, 16, 0)
    with pytest.raises(UnknownModelError):
        footprint_of("no-such-model", "float32", 4, 16, 0)
    with pytest.raises(InvalidRequestError, match="declared size"):
        footprint_of_spec(ModelSpec(0, "d", size_bytes=MB))


def test_registry_sizes_of_real_models_are_computed() -> None:
    spec = ModelSpec(0, "t", source="tiny", engine=EngineSettings(num_kv_blocks=8), activation_bytes=0)
    registry = Registry((spec,))
    assert registry.size_bytes(0) == 139_584 * 4 + 8 * 8192


def _fp(name: str, total_mb: int) -> Footprint:
    return Footprint(name, "float32", 1, total_mb * MB, 16, 1, 1, 0, 4096)


def test_plan_lists_maximal_sets_that_fit() -> None:
    plan = plan_capacity([_fp("a", 50), _fp("b", 40), _fp("c", 30), _fp("d", 200)], 100 * MB)
    named = [tuple(plan.footprints[i].name for i in s) for s in plan.fitting_sets]
    assert named == [("a", "b"), ("a", "c"), ("b", "c")]  # largest first; d fits nowhere
    assert [plan.fits_alone(i) for i in range(4)] == [True, True, True, False]
    data = plan.to_json()
    assert data["fitting_sets"][0] == {"models": ["a", "b"], "total_mb": pytest.approx(90.0)}


def test_plan_input_errors() -> None:
    with pytest.raises(InvalidRequestError, match="positive"):
        plan_capacity([_fp("a", 1)], 0)
    with pytest.raises(InvalidRequestError, match="no models"):
        plan_capacity([], MB)
    with pytest.raises(InvalidRequestError, match="at most"):
        plan_capacity([_fp(str(i), 1) for i in range(17)], MB)
