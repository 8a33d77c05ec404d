"""The Llama-family forward over the paged KV cache: every row of a step in one batched forward.

Rows of a step are laid out as [decode rows of R requests | chunk rows of request A | chunk rows of
request B ...]; matmuls and norms run over all rows at once (batch-invariant layers), attention runs
per group of rows that share a row count (all decodes together; each prefill chunk alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.kv.cache import KVCache
from engine.layers.attention import paged_attention
from engine.layers.linear import batch_dependent_linear, invariant_linear
from engine.layers.rmsnorm import rms_norm
from engine.layers.rope import Rope


@dataclass(frozen=True)
class AttentionGroup:
    """R requests with c query rows each, occupying rows [start, start + R * c) of the step."""

    start: int
    requests: int
    rows_each: int
    block_tables: torch.Tensor  # [R, nb] long
    positions: torch.Tensor  # [R, c] long


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: torch.Tensor  # [N] long
    positions: torch.Tensor  # [N] long
    slots: torch.Tensor  # [N] long: where each row's K/V is written
    groups: list[AttentionGroup]
    sample_rows: torch.Tensor  # [S] long: rows whose logits are returned


@dataclass
class Faults:
    """Documented fault-injection switches (set only through engine/testing.py)."""

    batch_dependent_matmul: bool = False
    fail_requests: set[str] = field(default_factory=set)


class PagedLlama:
    """Weights held once, in the engine's dtype; K/V live in the shared KVCache."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        invariant: bool,
        faults: Faults,
    ):
        self.config = config
        self.dtype = dtype
        self.device = device
        self.invariant = invariant
        self.faults = faults
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.rope = Rope(config.head_dim, config.rope_theta, config.max_position_embeddings, device)
        self.scale = config.head_dim**-0.5

    def weight(self, name: str) -> torch.Tensor:
        return self.w[name]

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.faults.batch_dependent_matmul:
            return batch_dependent_linear(x, weight)
        return invariant_linear(x, weight) if self.invariant else F.linear(x, weight)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Run one step's rows, writing their K/V; return float32 logits of the sample rows: [S, vocab]."""
        c = self.config
        n = batch.token_ids.shape[0]
        x = self.w["model.embed_tokens.weight"][batch.token_ids]  # [N, hidden]
        for layer in range(c.num_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            q = self._linear(h, self.w[p + "self_attn.q_proj.weight"]).view(n, c.num_heads, c.head_dim)
            k = self._linear(h, self.w[p + "self_attn.k_proj.weight"]).view(n, c.num_kv_heads, c.head_dim)
            v = self._linear(h, self.w[p + "self_attn.v_proj.weight"]).view(n, c.num_kv_heads, c.head_dim)
            q, k = self.rope.apply(q, batch.positions), self.rope.apply(k, batch.positions)
            kv.write(layer, batch.slots, k, v)
            attn = torch.empty(n, c.q_size, dtype=x.dtype, device=x.device)  # [N, heads * head_dim]
            for g in batch.groups:
                rows = slice(g.start, g.start + g.requests * g.rows_each)
                qg = q[rows].view(g.requests, g.rows_each, c.num_heads, c.head_dim)
                out = paged_attention(
                    qg, kv.keys[layer], kv.values[layer], g.block_tables, g.positions, self.scale
                )
                attn[rows] = out.reshape(-1, c.q_size)
            x = x + self._linear(attn, self.w[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate = self._linear(h, self.w[p + "mlp.gate_proj.weight"])
            up = self._linear(h, self.w[p + "mlp.up_proj.weight"])
            x = x + self._linear(F.silu(gate) * up, self.w[p + "mlp.down_proj.weight"])
        last = rms_norm(x[batch.sample_rows], self.w["model.norm.weight"], c.rms_norm_eps)
        return self._linear(last, self.lm_head).float()
