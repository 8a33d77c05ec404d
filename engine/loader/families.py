"""What Gemma 3 and Phi-3 files hold differently from Llama's, turned into the one forward's terms.

Gemma 3: its norms multiply by (1 + w), held as 1 + w (llama.cpp's converter writes them so; a Hugging
Face folder is shifted here); which layers slide and their RoPE base come from ``layer_types`` and
``rope_parameters`` (or the older ``sliding_window_pattern`` / ``rope_local_base_freq``). Phi-3: q, k
and v in one ``qkv_proj``, gate and up in one ``gate_up_proj`` (split here; the engine fuses them
again its own way), and longrope scaling.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import UnsupportedModelError
from engine.model_config import RopeScaling

GEMMA_PATTERN = 6  # Gemma 3: five windowed layers, then a global one (when a file does not say)
GEMMA_LOCAL_THETA = 10_000.0
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def gemma_windows(num_layers: int, window: int, pattern: int = GEMMA_PATTERN) -> tuple[int, ...]:
    """Each layer's window under Gemma's pattern: layer i is global when (i + 1) % pattern == 0."""
    return tuple(0 if (i + 1) % pattern == 0 else window for i in range(num_layers))


def gemma3_fields(raw: dict[str, Any], hidden: int, head_dim: int) -> dict[str, Any]:
    """ModelConfig fields a Gemma 3 config.json implies, beyond Llama's."""
    layers = int(raw["num_hidden_layers"])
    window = int(raw.get("sliding_window") or 0)
    types = raw.get("layer_types")
    if types:
        windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    else:
        windows = gemma_windows(layers, window, int(raw.get("sliding_window_pattern", GEMMA_PATTERN)))
    params = raw.get("rope_parameters") or {}
    full, local = params.get("full_attention"), params.get("sliding_attention") or {}
    if full is None:  # the older layout: top-level theta, local base and rope_scaling
        full = {"rope_theta": raw.get("rope_theta", 1_000_000.0), **(raw.get("rope_scaling") or {})}
        local = {"rope_theta": raw.get("rope_local_base_freq", GEMMA_LOCAL_THETA)}
    if raw.get("attn_logit_softcapping"):
        raise UnsupportedModelError("attention logit soft-capping (Gemma 2) is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"unsupported activation {act!r}")
    return {
        "rope_theta": float(full.get("rope_theta", 1_000_000.0)),
        "rope_scaling": rope_scaling(full),
        "layer_windows": windows if window else (),
        "local_rope_theta": float(local.get("rope_theta", GEMMA_LOCAL_THETA)),
        "sandwich_norms": True,
        "hidden_act": ACTIVATIONS[act],
        "embedding_scale": hidden**0.5,
        "query_scale": float(raw.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        "final_logit_softcap": float(raw.get("final_logit_softcapping") or 0.0),
        "qk_norm": True,
    }


def rope_scaling(spec: dict[str, Any], max_positions: int = 0) -> RopeScaling | None:
    """A Hugging Face rope_scaling / rope_parameters dict as a RopeScaling; None for the default
    rotation. An unknown type raises UnsupportedModelError (from RopeScaling)."""
    kind = spec.get("rope_type") or spec.get("type") or "default"
    if kind == "default":
        return None
    if float(spec.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("a partial rotary factor (RoPE over part of each head) is not supported")
    original = int(spec.get("original_max_position_embeddings", 8192))
    if kind in ("longrope", "su"):
        factor = spec.get("factor") or (max_positions / original)
        attention = spec.get("attention_factor")
        if attention is None:
            attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
        return RopeScaling(
            kind="longrope",
            factor=float(factor),
            original_max_position_embeddings=original,
            short_factor=tuple(float(v) for v in spec["short_factor"]),
            long_factor=tuple(float(v) for v in spec["long_factor"]),
            attention_factor=float(attention),
        )
    if kind == "yarn":
        factor = float(spec.get("factor") or (max_positions / original))
        attention = spec.get("attention_factor")
        if attention is None:
            mscale, all_dims = spec.get("mscale"), spec.get("mscale_all_dim")
            attention = (
                yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dims)
                if mscale and all_dims
                else yarn_mscale(factor)
            )
        return RopeScaling(
            kind="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            attention_factor=float(attention),
            beta_fast=float(spec.get("beta_fast") or 32.0),
            beta_slow=float(spec.get("beta_slow") or 1.0),
            truncate=bool(spec.get("truncate", True)),
        )
    return RopeScaling(
        kind=kind,
        factor=float(spec.get("factor", 1.0)),
        low_freq_factor=float(spec.get("low_freq_factor", 1.0)),
        high_freq_factor=float(spec.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
    )


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for a context stretched ``factor`` times."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
