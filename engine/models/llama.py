"""The Llama-family forward over the paged KV cache: every row of a step in one batched forward.

Rows of a step are laid out as [decode rows of R requests | chunk rows of request A | chunk rows of
request B ...]; matmuls and norms run over all rows at once (batch-invariant layers), attention runs
per group of rows that share a row count (all decodes together; each prefill chunk alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from engine import kernels
from engine.errors import UnsupportedModelError
from engine.kv.cache import KVCache
from engine.layers.attention import AttentionPlan, paged_attention, plan_attention
from engine.layers.linear import LinearWeight
from engine.layers.rmsnorm import rms_norm
from engine.layers.rope import Rope
from engine.layers.segmented_linear import SegmentedLinear
from engine.loader.mapped import release_pages
from engine.model_config import ModelConfig
from engine.models.decoder_layer import (
    LINEAR_PARTS,
    QKV_BIAS,
    QKV_BIAS_PARTS,
    DecoderLayerWeights,
    add_to_stack,
    decoder_layers,
    in_kernel_layout,
)
from engine.models.held_weights import int8_quantizes
from engine.quantized import QuantizedWeight, dense, quantize_q8_0

Weight = torch.Tensor | QuantizedWeight

# under activations "mixed", the linears whose context rows take int8 inputs: every layer linear but qkv,
# whose outputs are the K and V later tokens read (int8 there cost the most agreement; README)
CONTEXT_INT8_LINEARS = tuple(LINEAR_PARTS)[1:]


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
    # the last rows that are context rows: prompt tokens before a request's last (ModelRunner.build),
    # which only write K/V (the last layer stops at their K/V); under activations "mixed" their o,
    # gate_up and down inputs are int8
    context_rows: int = 0


@dataclass
class Faults:
    """Documented fault-injection switches (set only through engine/testing.py)."""

    batch_dependent_matmul: bool = False
    batch_dependent_norm: bool = False
    fail_requests: set[str] = field(default_factory=set)
    grammar_mask_off: bool = False  # constrained requests sample as if they had no grammar

    @property
    def active(self) -> bool:
        """Whether any switch is on. The engine asks once per step and looks at the switches only then
        (its slow path), so hooks that are off cost nothing per token or per request."""
        return (
            self.batch_dependent_matmul
            or self.batch_dependent_norm
            or self.grammar_mask_off
            or bool(self.fail_requests)
        )


class PagedLlama:
    """Weights held once, in the engine's dtype; K/V live in the shared KVCache.

    Linear weights are prepared once for the kernel (engine/layers/linear.py) and fused where rows
    share an input: q, k, v into one [q + 2 kv, hidden] weight, gate and up into one [2 inter, hidden].
    A fused output column is computed exactly as the unfused one (measured bit-identical). An LM head tied
    to the embedding is held once when packed or quantized, the lookup reading its rows from the head's
    panels (a plain float one, off the invariant CPU kernels, is held twice: plain for the lookup too).

    ``quantize`` (EngineConfig): "auto" keeps quantized weights quantized, "none" dequantizes them to
    ``dtype``, "int8" also quantizes float linear weights (K a multiple of 32) to Q8_0. Quantized
    weights need our CPU kernels: elsewhere they are dequantized. A GGUF file's F16 / BF16 matrices
    (config.half_weights) stay 16-bit under float32 on the invariant CPU kernels, which widen them
    exactly as they read them (the embedding rows widened as they are looked up).
    ``activations`` "int8" or "int16": their linears quantize each row's inputs per 32
    (engine/kernels/csrc/qdot.h).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, Weight],
        dtype: torch.dtype,
        device: torch.device,
        invariant: bool,
        faults: Faults,
        quantize: str = "auto",
        activations: str = "float",
    ):
        self.config = config
        self.activations = activations
        self.dtype = dtype
        self.device = device
        self.invariant = invariant
        self.faults = faults
        plain = self._held_weights(weights, quantize)
        # where each linear weight lives: name -> (prepared weight key, first row, rows)
        self.parts: dict[str, tuple[str, int, int]] = {}
        self.linears: dict[str, LinearWeight] = {}
        for layer in range(config.num_layers):
            p = f"model.layers.{layer}."
            for key, parts in LINEAR_PARTS.items():
                names = [p + part for part in parts]
                self._add_linear(p + key, names, [plain.pop(n) for n in names])
            if config.attention_bias:  # q | k | v biases, one vector like their fused weight
                biases = [plain.pop(p + name) for name in QKV_BIAS_PARTS]
                plain[p + QKV_BIAS] = torch.cat([dense(b) for b in biases])
        embedding = plain.pop("model.embed_tokens.weight")
        head = plain.pop("lm_head.weight", None)
        self._add_linear("lm_head", ["lm_head.weight"], [embedding if head is None else head])
        # the lookup table: a quantized one read through a packed linear (the head's when tied), a float one
        # tied to a packed head read from the head's panels; else plain
        self.embedding: LinearWeight | None = None
        if isinstance(embedding, QuantizedWeight):
            self.embedding = self.linears["lm_head"] if head is None else LinearWeight(embedding, True, dtype)
        elif head is None and self.linears["lm_head"].packed:
            self.embedding = self.linears["lm_head"]
        else:
            plain["model.embed_tokens.weight"] = embedding
        self.w: dict[str, torch.Tensor] = {k: v for k, v in plain.items() if isinstance(v, torch.Tensor)}
        self._hold_layers()
        if config.windowed and device.type != "cpu":
            raise UnsupportedModelError("a sliding attention window runs on the CPU kernels only")
        self.rope = Rope(
            config.head_dim, config.rope_theta, config.max_position_embeddings, device, config.rope_scaling
        )
        # Gemma 3's windowed layers rotate with their own base and no scaling
        self.local_rope = (
            Rope(config.head_dim, config.local_rope_theta, config.max_position_embeddings, device)
            if config.local_rope_theta
            else None
        )
        self.scale = config.attention_scale
        # the C++ layer loop over these weights and one KV cache (built on first use; see _decoder_stack)
        self._stack: tuple[KVCache, Any] | None = None
        self.fused_layers = True  # False: always the layer-by-layer path (tests compare the two)
        self.last_forward_fused = False

    def _hold_layers(self) -> None:
        """(Re)build each layer's record over the weights as held now (norms from ``w``, linears from
        ``linears``: the tensors themselves), and whether every layer linear is in the C++ kernels'
        layout (mutates; at load and after a weight is replaced)."""
        self.layers: list[DecoderLayerWeights[LinearWeight]] = decoder_layers(
            self.config, self.w, lambda p, key: self.linears[p + key]
        )
        self.layers_in_kernel_layout = all(in_kernel_layout(layer) for layer in self.layers)

    def _held_weights(self, weights: dict[str, Weight], quantize: str) -> dict[str, Weight]:
        """Each weight as this model holds it: on the device in ``dtype``, or quantized (see the class)."""
        keep_quantized = quantize != "none" and self.device.type == "cpu"
        tied_embedding = self.config.tie_word_embeddings or "lm_head.weight" not in weights
        keep_half = self.invariant and self.device.type == "cpu" and self.dtype == torch.float32
        half = dict(self.config.half_weights) if keep_half else {}
        held: dict[str, Weight] = {}
        for name, w in weights.items():
            if isinstance(w, QuantizedWeight) and keep_quantized:
                held[name] = w
                continue
            t = dense(w).to(device=self.device)
            int8 = quantize == "int8" and keep_quantized and t.dim() == 2
            if int8 and int8_quantizes(name, t.shape[1], tied_embedding):
                held[name] = quantize_q8_0(t.to(self.dtype))
            elif name in half and t.dtype in kernels.HALF_DTYPES:
                held[name] = t  # 16-bit, as the file holds it
            else:
                held[name] = t.to(self.dtype)
        return held

    def _add_linear(self, key: str, names: list[str], weights: list[Weight]) -> None:
        row = 0
        for name, t in zip(names, weights, strict=True):
            self.parts[name] = (key, row, t.shape[0])
            row += t.shape[0]
        quantized = [w for w in weights if isinstance(w, QuantizedWeight)]
        activations = self.activations
        if activations == "mixed" and not key.endswith(CONTEXT_INT8_LINEARS):
            activations = "int16"
        if len(quantized) == len(weights) and len({w.qtype for w in quantized}) > 1:
            # quantized types that differ (a Q4_K_M file's q, k in Q4_K and v in Q6_K): each held at its size
            self.linears[key] = SegmentedLinear.of_runs(quantized, self.invariant, self.dtype, activations)
            _release_file_pages(weights)
            return
        fused: list[QuantizedWeight] | list[torch.Tensor] = quantized  # the parts, stacked as they pack
        if len(quantized) < len(
            weights
        ):  # float, or float and quantized parts: the fused weight is held as float
            dtypes = {w.dtype if isinstance(w, torch.Tensor) else None for w in weights}
            dtype = dtypes.pop() if len(dtypes) == 1 else self.dtype  # 16-bit parts of one dtype stay so
            fused = [dense(w).to(device=self.device, dtype=dtype or self.dtype) for w in weights]
        self.linears[key] = LinearWeight(fused, self.invariant, self.dtype, activations)
        _release_file_pages(weights)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight held (plain, packed and quantized)."""
        plain = sum(t.numel() * t.element_size() for t in self.w.values())
        separate = self.embedding.nbytes if self.embedding not in (None, self.linears["lm_head"]) else 0
        return plain + separate + sum(lw.nbytes for lw in self.linears.values())

    @property
    def splits_context_rows(self) -> bool:
        """Whether a linear multiplies context rows (ForwardBatch.context_rows) in a format of their own."""
        return any(lw.context_format != lw.format for lw in self.linears.values())

    @property
    def holds_quantized(self) -> bool:
        """Whether any linear weight is held quantized (on the CPU kernels)."""
        return bool(self.quantized_types)

    @property
    def quantized_types(self) -> dict[str, int]:
        """GGUF type -> how many linear weights are held in it (empty when every weight is float)."""
        counts: dict[str, int] = {}
        for lw in self.linears.values():
            for qtype in lw.types if isinstance(lw, SegmentedLinear) else [lw.quantized]:
                if qtype:
                    counts[qtype] = counts.get(qtype, 0) + 1
        return counts

    def embed_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of ``token_ids`` [N] long: [N, hidden] in ``dtype`` (times the family's
        embedding scale: Gemma's sqrt(hidden), rounded to ``dtype`` first as transformers does)."""
        if self.embedding is not None:
            rows = self.embedding.rows(token_ids)
        else:
            rows = self.w["model.embed_tokens.weight"][token_ids].to(self.dtype)  # a 16-bit table widened
        if self.config.embedding_scale != 1.0:
            return rows * torch.tensor(self.config.embedding_scale, dtype=rows.dtype)
        return rows

    def weight(self, name: str) -> torch.Tensor:
        """Weight ``name`` (HF naming) as a plain tensor; for a linear, a copy of its rows."""
        if name == "model.embed_tokens.weight" and self.embedding is not None:
            return self.embedding.dense()
        if name in self.parts:
            key, row, rows = self.parts[name]
            return self.linears[key].dense()[row : row + rows].clone()
        return self.w[name]

    def set_weight(self, name: str, value: torch.Tensor) -> None:
        """Replace weight ``name`` in this model only (mutates; used by fault injection). A quantized
        linear it lands in is held as float from then on."""
        if name == "model.embed_tokens.weight" and self.embedding is not None:
            raise ValueError("a quantized embedding table cannot be replaced")
        self._stack = None  # it holds the replaced tensor
        if name in self.parts:
            key, row, rows = self.parts[name]
            # a copy when packed; the live weight, replaced at once, otherwise
            full = self.linears[key].dense()
            full[row : row + rows] = value
            self.linears[key].replace(full)
        else:  # a new tensor: the held one may be shared with the loaded model
            self.w[name] = value.to(device=self.device, dtype=self.dtype).clone()
        self._hold_layers()  # the records hold the replaced tensor too

    def runs_decoder_stack(self, kv: KVCache) -> bool:
        """Whether this model's layers can run in the C++ layer loop over ``kv`` (kernels.decoder_stack),
        where it computes exactly what ``_layers`` does: the one place this is decided. It needs

        - the compiled kernels (the portable backend has no layer loop), on the CPU;
        - float32 weights and activations, and a float32, float16 or int8 cache;
        - batch invariance (fast mode is the library's kernels) and no fault switched on;
        - none of Gemma's differences (config.gemma_like: the C++ loop has none of them);
        - every layer linear held as the kernels read it (``layers_in_kernel_layout``);
        - ``fused_layers`` left on (tests switch it off to compare the two paths).
        """
        faulty = self.faults.batch_dependent_matmul or self.faults.batch_dependent_norm
        return (
            self.fused_layers
            and not faulty
            and self.invariant
            and self.device.type == "cpu"
            and kernels.has_decoder_stack()
            and self.dtype == torch.float32
            and kv.keys[0].dtype in (torch.float32, torch.float16, torch.int8)
            and not self.config.gemma_like
            and self.layers_in_kernel_layout
        )

    def _decoder_stack(self, kv: KVCache) -> Any | None:
        """The C++ layer loop (engine/kernels: one call for every layer of a step) over these weights and
        ``kv``, built on first use and kept while ``kv`` and the weights stay; None where
        ``runs_decoder_stack`` says no."""
        if not self.runs_decoder_stack(kv):
            return None
        if self._stack is not None and self._stack[0] is kv:
            return self._stack[1]
        c = self.config
        stack = kernels.decoder_stack(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.rms_norm_eps,
            self.scale,
            c.sliding_window,
        )
        for n, layer in enumerate(self.layers):
            add_to_stack(stack, layer, kv.keys[n], kv.values[n], *kv.scales(n))
        self._stack = (kv, stack)
        return stack

    def _linear(self, x: torch.Tensor, linear: LinearWeight, context_rows: int = 0) -> torch.Tensor:
        """x [M, K] through ``linear``: [M, N]; its last ``context_rows`` rows are context rows."""
        if self.faults.batch_dependent_matmul:
            return linear.batch_dependent(x)
        return linear(x, context_rows)

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
        rows: int,
    ) -> torch.Tensor:
        """The attention of the step's first ``rows`` rows over the paged cache, in step order: q [N, H,
        d] -> [rows, H * d]. ``rows`` ends a group (the context rows' groups come last)."""
        c = self.config
        outs = []
        if self.device.type == "cpu":  # our kernel: every row over its own keys, read in place, one call
            out = kernels.attention(
                q[:rows], kv.keys[layer], kv.values[layer], tables, owners[:rows], positions[:rows],
                self.scale, c.window(layer), 0.0, *kv.scales(layer),
            )  # fmt: skip
            return out.view(-1, c.q_size).to(q.dtype)
        for g, plan in zip(groups, plans, strict=True):
            if g.start >= rows:
                break
            qg = q[g.start : g.start + g.requests * g.rows_each].view(
                g.requests, g.rows_each, c.num_heads, c.head_dim
            )
            out = paged_attention(qg, kv.keys[layer], kv.values[layer], plan, self.scale)
            outs.append(out.view(-1, c.q_size))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of x [N, D] with ``weight`` [D]; under the fault, eps grows with the row count."""
        eps = self.config.rms_norm_eps * (x.shape[0] if self.faults.batch_dependent_norm else 1)
        return rms_norm(x, weight, eps, self.invariant)

    def _gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up, act SiLU (GELU-tanh for Gemma): [N, 2 * inter] -> [N, inter] (our row-wise
        kernel on the CPU when invariant)."""
        gelu = self.config.hidden_act == "gelu_tanh"
        if self.invariant and self.device.type == "cpu":
            return kernels.silu_mul(gate_up, gelu).to(gate_up.dtype)
        gate, up = gate_up.split(self.config.intermediate_size, dim=1)
        return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """cap * tanh(logits / cap) where the family caps its logits; row by row, so a row's bits never
        depend on the rows beside it: [S, vocab] -> [S, vocab]."""
        cap = self.config.final_logit_softcap
        if not cap:
            return logits
        return torch.stack([torch.tanh(row / cap) * cap for row in logits]) if len(logits) else logits

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Run one step's rows, writing their K/V; return float32 logits of the sample rows: [S, vocab]."""
        x = self.embed_rows(batch.token_ids)  # [N, hidden]
        cos, sin = self.rope.tables(batch.positions)  # [N, 1, head_dim] each, shared by every layer
        local = self.local_rope.tables(batch.positions) if self.local_rope is not None else (cos, sin)
        stack = self._decoder_stack(kv)
        self.last_forward_fused = stack is not None
        if stack is not None:  # every layer in one C++ call, the same bits as _layers
            n = x.shape[0]
            x = kernels.decoder_forward(
                stack,
                x,
                batch.slots,
                cos.view(n, -1),
                sin.view(n, -1),
                batch.tables,
                batch.owners,
                batch.positions,
                batch.context_rows,
            )
        else:
            x = self._layers(x, batch, kv, (cos, sin), local)
        last = self._norm(x[batch.sample_rows], self.w["model.norm.weight"])
        return self._softcap(self._linear(last, self.linears["lm_head"]).float())

    def _layers(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        kv: KVCache,
        rotation: tuple[torch.Tensor, torch.Tensor],
        local: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Every decoder layer over the step's rows, one kernel call at a time: x [N, hidden] -> [N - C,
        hidden], C = ``batch.context_rows``: the last layer writes the context rows' K/V and drops them.
        ``rotation``: RoPE's cos and sin for the step's rows ([N, 1, head_dim] each); ``local``: those
        of windowed layers (Gemma 3's own base; the same tables for other families)."""
        c = self.config
        n = batch.token_ids.shape[0]
        group = c.num_heads // c.num_kv_heads
        plans = (
            []
            if self.device.type == "cpu"
            else [plan_attention(g.block_tables, g.positions, kv.block_size, group) for g in batch.groups]
        )
        kv_rows = kv.rows_of(batch.slots)  # [N * kv_heads]
        context = batch.context_rows
        heads_qk = c.num_heads + c.num_kv_heads
        qk_end = heads_qk * c.head_dim
        for layer, lw in enumerate(self.layers):
            h = self._norm(x, lw.input_norm)
            qkv = self._linear(h, lw.qkv, context)  # [N, q_size + 2 * kv_size]
            if lw.qkv_bias is not None:
                qkv = qkv + lw.qkv_bias
            qk = qkv[:, :qk_end].view(n, heads_qk, c.head_dim)
            if lw.q_norm is not None and lw.k_norm is not None:  # each head of q and k normalised on its own
                q_rows = self._norm(qk[:, : c.num_heads].reshape(-1, c.head_dim), lw.q_norm)
                k_rows = self._norm(qk[:, c.num_heads :].reshape(-1, c.head_dim), lw.k_norm)
                qk = torch.cat(
                    [q_rows.view(n, c.num_heads, -1), k_rows.view(n, c.num_kv_heads, -1)], dim=1
                )  # [N, H + Hkv, d]
            # q and k rotated in one elementwise pass (mul/add round alike on any layout): [N, H + Hkv, d]
            cos, sin = local if c.window(layer) else rotation
            qk = self.rope.rotate(qk, cos, sin)
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            v = qkv[:, qk_end:].view(n, c.num_kv_heads, c.head_dim)
            kv.write(layer, kv_rows, k, v)
            # nothing reads a context row past its K/V: the last layer attends for the other rows only
            rows = n - context if layer == c.num_layers - 1 else n
            attn = self._attention(
                q, kv, layer, batch.groups, plans, batch.tables, batch.owners, batch.positions, rows
            )  # [rows, heads * head_dim]
            if rows < n:
                x, context = x[:rows], 0  # [N - context, hidden]
            out = self._linear(attn, lw.o, context)
            if lw.attention_output_norm is not None:  # Gemma: normed before the residual add
                out = self._norm(out, lw.attention_output_norm)
            x = x + out
            h = self._norm(x, lw.mlp_norm)
            gate_up = self._linear(h, lw.gate_up, context)  # [N, 2 * inter]
            out = self._linear(self._gated(gate_up), lw.down, context)
            if lw.mlp_output_norm is not None:
                out = self._norm(out, lw.mlp_output_norm)
            x = x + out
        return x


def _release_file_pages(weights: list[Weight]) -> None:
    """Let go of the model file's pages under ``weights`` once a linear holds them repacked (a no-op for
    weights that are not views of a mapped file: engine/loader/mapped.py), so a load holds the packed
    weights plus one tensor's file pages, not two copies."""
    for w in weights:
        raw = w.blocks if isinstance(w, QuantizedWeight) else w
        release_pages(raw.data_ptr(), raw.nbytes)
