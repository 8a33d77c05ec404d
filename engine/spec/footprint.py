"""What a draft model adds to its target's footprint: its weights as held and a KV pool of its own
(as many blocks as the target's, engine/spec/draft.py), so a pool under a budget counts both."""

from __future__ import annotations

import dataclasses

from engine.config import ModelConfig
from engine.errors import InvalidRequestError
from engine.mux.footprint import Footprint
from engine.mux.registry import ModelSpec
from engine.spec.draft import SELF_DRAFT


def draft_config(draft_model: str, target: ModelConfig) -> ModelConfig:
    """The draft's config, read from its files (or the target's first N layers for ``layers:N``)."""
    if draft_model.startswith(SELF_DRAFT):
        count = draft_model.removeprefix(SELF_DRAFT)
        if not count.isdigit() or not 1 <= int(count) < target.num_layers:
            raise InvalidRequestError(
                f"draft model {draft_model!r}: write {SELF_DRAFT}N with N in [1, {target.num_layers - 1}]"
            )
        return dataclasses.replace(
            target,
            num_layers=int(count),
            quantized_weights=tuple(
                (n, t)
                for n, t in target.quantized_weights
                if not n.startswith("model.layers.") or int(n.split(".")[2]) < int(count)
            ),
        )
    from engine.loader import load_config

    return load_config(draft_model)


def with_draft(footprint: Footprint, spec: ModelSpec, target: ModelConfig, draft_model: str) -> Footprint:
    """``footprint`` of ``spec`` with the draft's weights (held as the target's dtype and quantize
    say) and its KV pool counted in ``draft_bytes``."""
    from engine.models.held_weights import held_kv_dtype, held_weight_bytes

    draft = draft_config(draft_model, target)
    engine = spec.engine
    weights = held_weight_bytes(draft, engine.dtype, engine.quantize)
    kv_dtype = held_kv_dtype(draft, engine.dtype, engine.quantize, engine.kv_cache_dtype)
    kv = engine.num_kv_blocks * engine.block_size * draft.kv_bytes_per_token(kv_dtype)
    return dataclasses.replace(footprint, draft_bytes=weights + kv)
