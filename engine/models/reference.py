"""The plain Llama-family forward over a contiguous KV cache: the yardstick the paged engine is checked against.

Readable on purpose: RMSNorm (torch's, through engine/layers/rmsnorm.py), RoPE (rotate-half, the
config's theta and scaling), grouped-query attention with a causal mask (and a sliding window where the
family has one), q/k/v biases and per-head q/k norms where the family has them, SwiGLU, tied or untied
head; Gemma 3's scaled embeddings, norms around attention and MLP, GELU gate, local RoPE base and logit
soft-cap. No batching, no paging, no invariance tricks. Each layer's weights as the paged model names them (engine/models/decoder_layer.py),
its linears as the checkpoint holds them: q, k, v, gate and up each apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.layers.rmsnorm import rms_norm
from engine.layers.rope import inverse_frequencies
from engine.model_config import ModelConfig, RopeScaling
from engine.models.decoder_layer import LINEAR_PARTS, QKV_BIAS, QKV_BIAS_PARTS, decoder_layers

Parts = tuple[torch.Tensor, ...]  # a linear as the checkpoint holds it: its weights, unfused


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    scaling: RopeScaling | None = None,
    context: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for positions: each [T, head_dim] (the half-dim frequencies repeated twice)."""
    inv_freq = inverse_frequencies(head_dim, theta, scaling, context)
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]  # [T, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, head_dim]
    gain = scaling.attention_factor if scaling is not None else 1.0
    return emb.cos() * gain, emb.sin() * gain


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, head_dim]; cos/sin: [T, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None, :] + rotated.float() * sin[:, None, :]).to(x.dtype)


@dataclass
class ContiguousCache:
    """K and V for every layer, one contiguous buffer per layer: [max_len, kv_heads, head_dim]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0


class ReferenceLlama:
    """Llama forward over a contiguous cache; one sequence at a time."""

    def __init__(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
    ):
        self.config = config
        self.dtype = dtype
        self.device = device
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        for n in range(config.num_layers):  # q | k | v biases as one vector, split again where they are added
            p = f"model.layers.{n}."
            if all(p + name in self.w for name in QKV_BIAS_PARTS):
                self.w[p + QKV_BIAS] = torch.cat([self.w[p + name] for name in QKV_BIAS_PARTS])
        self.layers = decoder_layers(config, self.w, self._parts)

    def _parts(self, p: str, key: str) -> Parts:
        """The checkpoint weights of held linear ``key`` of the layer named ``p``..., unfused."""
        return tuple(self.w[p + name] for name in LINEAR_PARTS[key])

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of x [T, ..., D] with ``weight`` [D], torch's (no invariance needed here)."""
        return rms_norm(x, weight, self.config.rms_norm_eps, invariant=False)

    def new_cache(self, max_len: int) -> ContiguousCache:
        c = self.config
        shape = (max_len, c.num_kv_heads, c.head_dim)
        make = lambda: torch.zeros(shape, dtype=self.dtype, device=self.device)  # noqa: E731
        return ContiguousCache([make() for _ in range(c.num_layers)], [make() for _ in range(c.num_layers)])

    @torch.inference_mode()
    def forward(self, token_ids: list[int], cache: ContiguousCache) -> torch.Tensor:
        """Run ``token_ids`` after what ``cache`` holds; append their K/V; return logits [T, vocab] (float32)."""
        c = self.config
        start, count = cache.length, len(token_ids)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        x = self.w["model.embed_tokens.weight"][ids] * c.embedding_scale  # [T, hidden]
        positions = torch.arange(start, start + count, device=self.device)
        context = c.max_position_embeddings
        rotation = rope_cos_sin(positions, c.head_dim, c.rope_theta, c.rope_scaling, context)
        local = rope_cos_sin(positions, c.head_dim, c.local_rope_theta) if c.local_rope_theta else rotation
        group = c.num_heads // c.num_kv_heads
        causal = torch.ones(count, start + count, dtype=torch.bool, device=self.device).tril(start)
        for n, layer in enumerate(self.layers):
            mask, (cos, sin) = causal, rotation
            if c.window(n):  # a row sees its last ``window`` positions only
                mask = causal & ~torch.ones_like(causal).tril(start - c.window(n))
                cos, sin = local
            h = self._norm(x, layer.input_norm)
            biases = (
                (None,) * 3
                if layer.qkv_bias is None
                else layer.qkv_bias.split([c.q_size, c.kv_size, c.kv_size])
            )
            q, k, v = (F.linear(h, w, b) for w, b in zip(layer.qkv, biases, strict=True))
            q = q.view(count, c.num_heads, c.head_dim)
            k = k.view(count, c.num_kv_heads, c.head_dim)
            v = v.view(count, c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            cache.keys[n][start : start + count] = k
            cache.values[n][start : start + count] = v
            keys = cache.keys[n][: start + count].repeat_interleave(group, dim=1)  # [S, heads, d]
            values = cache.values[n][: start + count].repeat_interleave(group, dim=1)
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1),
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=mask,
                scale=c.attention_scale,
            )  # [heads, T, d]
            out = F.linear(attn.transpose(0, 1).reshape(count, c.q_size), *layer.o)
            if layer.attention_output_norm is not None:
                out = self._norm(out, layer.attention_output_norm)
            x = x + out
            h = self._norm(x, layer.mlp_norm)
            gate, up = (F.linear(h, w) for w in layer.gate_up)
            act = F.gelu(gate, approximate="tanh") if c.hidden_act == "gelu_tanh" else F.silu(gate)
            out = F.linear(act * up, *layer.down)
            if layer.mlp_output_norm is not None:
                out = self._norm(out, layer.mlp_output_norm)
            x = x + out
        cache.length = start + count
        x = self._norm(x, self.w["model.norm.weight"])
        logits = F.linear(x, self.lm_head).float()
        cap = c.final_logit_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    def greedy(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy continuation of ``prompt_ids`` (stops after a stop token, which is included)."""
        cache = self.new_cache(len(prompt_ids) + max_new_tokens)
        logits = self.forward(prompt_ids, cache)
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(logits[-1].argmax())
            out.append(token)
            if token in stop_ids:
                break
            logits = self.forward([token], cache)
        return out
