"""A family's loaded weights turned into the one forward's terms: Phi-3's fused q|k|v and gate|up split
into Llama's names, Gemma's norms held as 1 + w (engine/loader/families.py says why)."""

from __future__ import annotations

import torch

from engine.model_config import ModelConfig
from engine.quantized import QuantizedWeight

Weights = dict[str, torch.Tensor | QuantizedWeight]


def split_fused(weights: Weights, config: ModelConfig) -> None:
    """Phi-3's fused q|k|v and gate|up weights split into Llama's names (mutates ``weights``)."""
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        for fused, parts in (
            ("self_attn.qkv_proj.weight", (("self_attn.q_proj.weight", q), ("self_attn.k_proj.weight", kv), ("self_attn.v_proj.weight", kv))),
            ("mlp.gate_up_proj.weight", (("mlp.gate_proj.weight", inter), ("mlp.up_proj.weight", inter))),
        ):  # fmt: skip
            if p + fused not in weights:
                continue
            whole = weights.pop(p + fused)
            row = 0
            for name, rows in parts:
                weights[p + name] = _rows(whole, row, rows)
                row += rows


def _rows(w: torch.Tensor | QuantizedWeight, start: int, count: int) -> torch.Tensor | QuantizedWeight:
    """Rows [start, start + count) of a weight, quantized blocks kept."""
    if isinstance(w, QuantizedWeight):
        return w.take_rows(torch.arange(start, start + count))
    return w[start : start + count].clone()


def shift_norms(weights: Weights) -> None:
    """Gemma's (1 + w) norm weights held as 1 + w (mutates ``weights``; float tensors only)."""
    for name, w in weights.items():
        if name.endswith("norm.weight") and isinstance(w, torch.Tensor):
            weights[name] = w + 1.0
