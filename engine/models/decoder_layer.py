"""A decoder layer's weights as one record, built once at load: what every layer loop reads.

One Llama-family layer, families differing by data (a part that is None: the family has none):

    x -> input_norm -> qkv (+ qkv_bias) -> q_norm, k_norm -> RoPE -> attention -> o
      -> attention_output_norm -> x + out -> mlp_norm -> gate_up -> act(gate) * up -> down
      -> mlp_output_norm -> x + out

The fields follow the C++ stack's ``DecoderLayer`` (engine/kernels/csrc/decoder.h), in its order, its
KV caches aside (the model's KVCache holds them); Gemma's two extra norms come last (the C++ stack has
neither). ``L`` is how a linear is held: the paged model's LinearWeight (q|k|v and gate|up fused,
prepared for the kernels) or the reference's tuple of plain tensors (the checkpoint's parts).
``add_to_stack`` hands a record to the C++ stack: the one place it is unpacked into arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from engine.layers.linear import LinearWeight
from engine.model_config import ModelConfig

L = TypeVar("L")

# a layer's linears as held, in the C++ stack's order: held key -> the checkpoint weights it holds
# (q, k and v fused into one; gate and up into one)
LINEAR_PARTS = {
    "self_attn.qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attn.o_proj.weight": ("self_attn.o_proj.weight",),
    "mlp.gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.down_proj.weight": ("mlp.down_proj.weight",),
}
QKV_BIAS = "self_attn.qkv.bias"  # the q | k | v biases as one vector, like their fused weight
QKV_BIAS_PARTS = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")


@dataclass(frozen=True)
class DecoderLayerWeights(Generic[L]):
    """One decoder layer's weights (shapes as [N, K] for a linear); tensors are held, not copied."""

    input_norm: torch.Tensor  # [hidden]: the attention's input norm
    post_norm: (
        torch.Tensor
    )  # [hidden]: post_attention_layernorm (the MLP's input norm; Gemma: attention output's)
    qkv: L  # [q + 2 kv, hidden]
    o: L  # [hidden, q]
    gate_up: L  # [2 inter, hidden]
    down: L  # [hidden, inter]
    qkv_bias: torch.Tensor | None = None  # [q + 2 kv] (Qwen2)
    q_norm: torch.Tensor | None = None  # [head_dim]: each head of q normalised on its own (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None  # [head_dim]: each head of k
    pre_feedforward_norm: torch.Tensor | None = None  # [hidden]: Gemma's MLP input norm
    post_feedforward_norm: torch.Tensor | None = None  # [hidden]: Gemma's MLP output norm

    def __post_init__(self) -> None:
        if (self.q_norm is None) != (self.k_norm is None):
            raise ValueError("q and k norms come together")
        if (self.pre_feedforward_norm is None) != (self.post_feedforward_norm is None):
            raise ValueError("Gemma's feed-forward norms come together")

    @property
    def sandwich(self) -> bool:
        """Whether norms sit after attention and after the MLP too, before their residual adds (Gemma)."""
        return self.pre_feedforward_norm is not None

    @property
    def attention_output_norm(self) -> torch.Tensor | None:
        """The norm of the attention's output before the residual add (Gemma's post_attention_layernorm)."""
        return self.post_norm if self.sandwich else None

    @property
    def mlp_norm(self) -> torch.Tensor:
        """The norm of the MLP's input: post_attention_layernorm, or Gemma's pre_feedforward_layernorm."""
        return self.pre_feedforward_norm if self.pre_feedforward_norm is not None else self.post_norm

    @property
    def mlp_output_norm(self) -> torch.Tensor | None:
        """The norm of the MLP's output before the residual add (Gemma's post_feedforward_layernorm)."""
        return self.post_feedforward_norm


def decoder_layers(
    config: ModelConfig, tensors: Mapping[str, torch.Tensor], linear: Callable[[str, str], L]
) -> list[DecoderLayerWeights[L]]:
    """Every layer's record: norms and bias from ``tensors`` (checkpoint names, the q|k|v bias fused
    under QKV_BIAS), each linear as ``linear(layer prefix, held key)`` gives it (keys of LINEAR_PARTS).
    The q/k norms and Gemma's norms are read where the config says the family has them; the bias
    wherever ``tensors`` holds one."""
    return [_layer(config, f"model.layers.{n}.", tensors, linear) for n in range(config.num_layers)]


def _layer(
    config: ModelConfig, p: str, tensors: Mapping[str, torch.Tensor], linear: Callable[[str, str], L]
) -> DecoderLayerWeights[L]:
    """The record of the layer whose weights are named ``p`` + ... (``decoder_layers``)."""

    def norm(present: bool, name: str) -> torch.Tensor | None:
        return tensors[p + name] if present else None

    qkv, o, gate_up, down = (linear(p, key) for key in LINEAR_PARTS)
    return DecoderLayerWeights(
        input_norm=tensors[p + "input_layernorm.weight"],
        post_norm=tensors[p + "post_attention_layernorm.weight"],
        qkv=qkv,
        o=o,
        gate_up=gate_up,
        down=down,
        qkv_bias=tensors.get(p + QKV_BIAS),
        q_norm=norm(config.qk_norm, "self_attn.q_norm.weight"),
        k_norm=norm(config.qk_norm, "self_attn.k_norm.weight"),
        pre_feedforward_norm=norm(config.sandwich_norms, "pre_feedforward_layernorm.weight"),
        post_feedforward_norm=norm(config.sandwich_norms, "post_feedforward_layernorm.weight"),
    )


def in_kernel_layout(layer: DecoderLayerWeights[LinearWeight]) -> bool:
    """Whether every linear of ``layer`` is held as our C++ kernels read it (LinearWeight.kernel_segments:
    whole, or in segments of different types)."""
    return all(lw.kernel_segments is not None for lw in (layer.qkv, layer.o, layer.gate_up, layer.down))


def stack_arguments(
    layer: DecoderLayerWeights[LinearWeight],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> list[Any]:
    """``layer`` over these caches as DecoderStack.add_layer's arguments (csrc/decoder.h), in its order:
    each linear's (data, format), the caches and their scales (an int8 cache's), absent parts as empty
    tensors, then the linears' context formats. Needs ``in_kernel_layout(layer)`` and no Gemma norms (the
    C++ stack has none)."""
    linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
    if layer.sandwich or not in_kernel_layout(layer):
        raise ValueError("the C++ layer loop takes linears in the kernels' layout and no sandwich norms")
    absent = torch.empty(0)
    # a linear in segments: an empty tensor here, its segments given by split_linear (add_to_stack)
    whole = [lw.kernel_layout or (absent, lw.format) for lw in linears]
    (qkv, qkv_format), (o, o_format), (gate_up, gate_up_format), (down, down_format) = whole
    return [
        layer.input_norm, qkv, qkv_format, o, o_format, layer.post_norm, gate_up, gate_up_format, down,
        down_format, k_cache, v_cache, absent if k_scales is None else k_scales,
        absent if v_scales is None else v_scales, absent if layer.qkv_bias is None else layer.qkv_bias,
        absent if layer.q_norm is None else layer.q_norm, absent if layer.k_norm is None else layer.k_norm,
        [lw.context_format for lw in linears],
    ]  # fmt: skip


def add_to_stack(
    stack: Any,
    layer: DecoderLayerWeights[LinearWeight],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> None:
    """Append ``layer``, over these caches (and an int8 cache's scales), to a C++ layer loop
    (kernels.decoder_stack; mutates ``stack``, which holds the tensors by reference)."""
    stack.add_layer(*stack_arguments(layer, k_cache, v_cache, k_scales, v_scales))
    for which, lw in enumerate((layer.qkv, layer.o, layer.gate_up, layer.down)):
        segments = lw.kernel_segments
        if lw.kernel_layout is None and segments:
            datas, formats, contexts, widths = (list(column) for column in zip(*segments, strict=True))
            stack.split_linear(which, datas, formats, contexts, widths)
