"""The Llama-family forward over the paged KV cache: every row of a step in one batched forward.

Rows of a step are laid out as [decode rows of R requests | chunk rows of request A | chunk rows of
request B ...]; matmuls and norms run over all rows at once (batch-invariant layers), attention runs
per group of rows that share a row count (all decodes together; each prefill chunk alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine import kernels
from engine.config import ModelConfig
from engine.kv.cache import KVCache
from engine.layers.attention import AttentionPlan, paged_attention, plan_attention
from engine.layers.linear import LinearWeight
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
    tables: torch.Tensor  # [R, nb] long: every request's block table (padded), decodes first
    owners: torch.Tensor  # [N] long: the row of ``tables`` each row belongs to


@dataclass
class Faults:
    """Documented fault-injection switches (set only through engine/testing.py)."""

    batch_dependent_matmul: bool = False
    batch_dependent_norm: bool = False
    fail_requests: set[str] = field(default_factory=set)


class PagedLlama:
    """Weights held once, in the engine's dtype; K/V live in the shared KVCache.

    Linear weights are prepared once for the kernel (engine/layers/linear.py) and fused where rows
    share an input: q, k, v into one [q + 2 kv, hidden] weight, gate and up into one [2 inter, hidden].
    A fused output column is computed exactly as the unfused one (measured bit-identical). The LM
    head, when tied to the embedding, is held twice: plain for the lookup, packed for the matmul.
    """

    FUSED = {
        "self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    }

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
        plain = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        # where each linear weight lives: name -> (prepared weight key, first row, rows)
        self.parts: dict[str, tuple[str, int, int]] = {}
        self.linears: dict[str, LinearWeight] = {}
        for layer in range(config.num_layers):
            p = f"model.layers.{layer}."
            for fused, members in self.FUSED.items():
                names = [p + m + ".weight" for m in members]
                self._add_linear(p + fused, names, [plain.pop(n) for n in names])
            for single in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                self._add_linear(p + single, [p + single], [plain.pop(p + single)])
        head = plain.pop("lm_head.weight", None)
        self._add_linear(
            "lm_head", ["lm_head.weight"], [head if head is not None else plain["model.embed_tokens.weight"]]
        )
        self.w = plain  # embeddings and norms
        self.rope = Rope(config.head_dim, config.rope_theta, config.max_position_embeddings, device)
        self.scale = config.head_dim**-0.5

    def _add_linear(self, key: str, names: list[str], tensors: list[torch.Tensor]) -> None:
        row = 0
        for name, t in zip(names, tensors, strict=True):
            self.parts[name] = (key, row, t.shape[0])
            row += t.shape[0]
        self.linears[key] = LinearWeight(torch.cat(tensors), self.invariant)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight held (plain and packed)."""
        plain = sum(t.numel() * t.element_size() for t in self.w.values())
        return plain + sum(lw.nbytes for lw in self.linears.values())

    def weight(self, name: str) -> torch.Tensor:
        """Weight ``name`` (HF naming) as a plain tensor; for a linear, a copy of its rows."""
        if name in self.parts:
            key, row, rows = self.parts[name]
            return self.linears[key].dense()[row : row + rows].clone()
        return self.w[name]

    def set_weight(self, name: str, value: torch.Tensor) -> None:
        """Replace weight ``name`` (mutates; used by fault injection)."""
        if name not in self.parts:
            self.w[name].copy_(value)
            return
        key, row, rows = self.parts[name]
        full = self.linears[key].dense()  # a copy when packed; the live weight, replaced at once, otherwise
        full[row : row + rows] = value
        self.linears[key].replace(full)

    def _linear(self, x: torch.Tensor, key: str) -> torch.Tensor:
        if self.faults.batch_dependent_matmul:
            return self.linears[key].batch_dependent(x)
        return self.linears[key](x)

    def _attention(
        self,
        q: torch.Tensor,
        kv: KVCache,
        layer: int,
        groups: list[AttentionGroup],
        plans: list[AttentionPlan],
        tables: torch.Tensor,
        owners: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """Each group's attention over the paged cache, rows in step order: q [N, H, d] -> [N, H * d]."""
        c = self.config
        outs = []
        if self.device.type == "cpu":  # our kernel: every row over its own keys, read in place, one call
            out = kernels.attention(
                q, kv.keys[layer], kv.values[layer], tables, owners, positions, self.scale
            )
            return out.view(-1, c.q_size).to(q.dtype)
        for g, plan in zip(groups, plans, strict=True):
            qg = q[g.start : g.start + g.requests * g.rows_each].view(
                g.requests, g.rows_each, c.num_heads, c.head_dim
            )
            out = paged_attention(qg, kv.keys[layer], kv.values[layer], plan, self.scale)
            outs.append(out.view(-1, c.q_size))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """RMSNorm of x [N, hidden] with weight ``name``; under the fault, eps grows with the row count."""
        eps = self.config.rms_norm_eps * (x.shape[0] if self.faults.batch_dependent_norm else 1)
        return rms_norm(x, self.w[name], eps, self.invariant)

    def _gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up: [N, 2 * inter] -> [N, inter] (our row-wise kernel on the CPU when invariant)."""
        if self.invariant and self.device.type == "cpu":
            return kernels.silu_mul(gate_up).to(gate_up.dtype)
        gate, up = gate_up.split(self.config.intermediate_size, dim=1)
        return F.silu(gate) * up

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Run one step's rows, writing their K/V; return float32 logits of the sample rows: [S, vocab]."""
        c = self.config
        n = batch.token_ids.shape[0]
        x = self.w["model.embed_tokens.weight"][batch.token_ids]  # [N, hidden]
        group = c.num_heads // c.num_kv_heads
        plans = (
            []
            if self.device.type == "cpu"
            else [plan_attention(g.block_tables, g.positions, kv.block_size, group) for g in batch.groups]
        )
        kv_rows = kv.rows_of(batch.slots)  # [N * kv_heads]
        cos, sin = self.rope.tables(batch.positions)  # [N, 1, head_dim] each, shared by every layer
        heads_qk = c.num_heads + c.num_kv_heads
        qk_end = heads_qk * c.head_dim
        for layer in range(c.num_layers):
            p = f"model.layers.{layer}."
            h = self._norm(x, p + "input_layernorm.weight")
            qkv = self._linear(h, p + "self_attn.qkv")  # [N, q_size + 2 * kv_size]
            # q and k rotated in one elementwise pass (mul/add round alike on any layout): [N, H + Hkv, d]
            qk = self.rope.rotate(qkv[:, :qk_end].view(n, heads_qk, c.head_dim), cos, sin)
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            v = qkv[:, qk_end:].view(n, c.num_kv_heads, c.head_dim)
            kv.write(layer, kv_rows, k, v)
            attn = self._attention(
                q, kv, layer, batch.groups, plans, batch.tables, batch.owners, batch.positions
            )  # [N, heads * head_dim]
            x = x + self._linear(attn, p + "self_attn.o_proj.weight")
            h = self._norm(x, p + "post_attention_layernorm.weight")
            gate_up = self._linear(h, p + "mlp.gate_up")  # [N, 2 * inter]
            x = x + self._linear(self._gated(gate_up), p + "mlp.down_proj.weight")
        last = self._norm(x[batch.sample_rows], "model.norm.weight")
        return self._linear(last, "lm_head").float()
