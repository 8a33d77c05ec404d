"""The bytes PagedLlama holds for a model's weights, from its config alone (no tensor is read).

The same holding rules as engine/models/llama.py, counted instead of applied: fused q|k|v and gate|up
linears, quantized when all their parts are quantized (packed tiles, see engine/kernels/quant_pack.py;
parts of different types as segments, engine/layers/segmented_linear.py), float otherwise (packed panels of 16 rows on the CPU when invariant:
float32, or bfloat16 / float16 kept; a GGUF file's F16 / BF16 matrices, config.half_weights, kept 16-bit
under float32 when every part of a linear is in one of them); a float embedding table held beside a
tied head (16-bit when the file's is), a quantized one read through it.
tests/engine/test_quantized_engine.py and tests/engine/loader/test_gguf_half.py check these counts
against loaded engines.
"""

from __future__ import annotations

import itertools

from engine.model_config import ModelConfig, dtype_bytes
from engine.quant_layout import BLOCK, PANEL, packed_bytes
from engine.settings import DTYPE_NAMES, QUANTIZE_MODES, check_choice, kv_cache_dtype_name

EMBEDDING = "model.embed_tokens.weight"


def int8_quantizes(name: str, k: int, tied: bool) -> bool:
    """Whether ``--quantize int8`` turns float weight ``name`` (K = ``k`` inputs) into Q8_0: the linears,
    the LM head and a tied embedding (it is the head), when K is a multiple of the 32-wide block."""
    linear = name.endswith("proj.weight") or name == "lm_head.weight" or (name == EMBEDDING and tied)
    return linear and k % BLOCK == 0


def held_weight_bytes(
    config: ModelConfig, dtype: str, quantize: str = "auto", invariant: bool = True, on_cpu: bool = True
) -> int:
    """Bytes of every weight a PagedLlama of ``config`` holds with these engine settings."""
    streamed, table, _ = _weight_bytes(config, dtype, quantize, invariant, on_cpu)
    return streamed + table


def holds_quantized(config: ModelConfig, quantize: str = "auto", on_cpu: bool = True) -> bool:
    """Whether a PagedLlama of ``config`` holds any linear weight quantized (PagedLlama.holds_quantized),
    which picks its KV cache's dtype under kv_cache_dtype "auto" (engine/config.py)."""
    return _weight_bytes(config, "float32", quantize, True, on_cpu)[2]


def held_kv_dtype(
    config: ModelConfig, dtype: str, quantize: str = "auto", kv_cache_dtype: str = "auto"
) -> str:
    """The dtype (by name) an engine of ``config`` with these settings (on the CPU) holds its KV pool in."""
    return kv_cache_dtype_name(kv_cache_dtype, dtype, holds_quantized(config, quantize))


def streamed_weight_bytes(
    config: ModelConfig, dtype: str, quantize: str = "auto", invariant: bool = True, on_cpu: bool = True
) -> int:
    """Bytes one forward reads: every linear, the LM head and the norms as held (the embedding table
    is looked up a few rows at a time, so it is left out)."""
    return _weight_bytes(config, dtype, quantize, invariant, on_cpu)[0]


def _weight_bytes(
    config: ModelConfig, dtype: str, quantize: str, invariant: bool, on_cpu: bool
) -> tuple[int, int, bool]:
    """(bytes of the linears, head and norms; bytes of a separately held embedding table; whether any
    linear is held quantized)."""
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"unsupported quantize mode {quantize!r}")
    check_choice("dtype", dtype, DTYPE_NAMES)
    width = dtype_bytes(dtype)
    packed = invariant and on_cpu
    panel_width = (2 if dtype in ("bfloat16", "float16") else 4) if packed else width
    file_types = dict(config.quantized_weights) if quantize != "none" and on_cpu else {}
    half = dict(config.half_weights) if packed and dtype == "float32" else {}
    tied = config.tie_word_embeddings
    quantized: list[str] = []  # the type of each linear held quantized

    def kind(name: str, k: int) -> str | None:
        if name in file_types:
            return file_types[name]
        return "Q8_0" if quantize == "int8" and on_cpu and int8_quantizes(name, k, tied) else None

    def linear(parts: list[tuple[str, int]], k: int) -> int:
        kinds = [kind(name, k) for name, _ in parts]
        rows = sum(r for _, r in parts)
        if None not in kinds:  # quantized; parts of different types as segments (SegmentedLinear)
            quantized.extend(dict.fromkeys(qtype for qtype in kinds if qtype is not None))
            part_rows = [(qtype, n) for qtype, (_, n) in zip(kinds, parts, strict=True)]
            runs = itertools.groupby(part_rows, key=lambda part: part[0])  # consecutive parts of one type
            return sum(packed_bytes(str(qtype), sum(n for _, n in run), k) for qtype, run in runs)
        halves = {half.get(name) for name, _ in parts}
        held_width = 2 if len(halves) == 1 and None not in halves and set(kinds) == {None} else panel_width
        return (-(-rows // PANEL) * PANEL if packed else rows) * k * held_width

    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    total = 0
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        attn, mlp = p + "self_attn.", p + "mlp."
        total += linear(
            [(attn + "q_proj.weight", q), (attn + "k_proj.weight", kv), (attn + "v_proj.weight", kv)], h
        )
        total += linear([(attn + "o_proj.weight", h)], q)
        total += linear([(mlp + "gate_proj.weight", inter), (mlp + "up_proj.weight", inter)], h)
        total += linear([(mlp + "down_proj.weight", h)], inter)
    total += linear([(EMBEDDING if tied else "lm_head.weight", config.vocab_size)], h)
    norms_per_layer = 4 if config.sandwich_norms else 2  # Gemma: norms after attention and MLP too
    total += (norms_per_layer * config.num_layers + 1) * h * width
    total += (
        config.num_layers
        * width
        * ((q + 2 * kv if config.attention_bias else 0) + (2 * config.head_dim if config.qk_norm else 0))
    )  # a family's q/k/v biases and per-head q/k norm weights
    embedding_kind = kind(EMBEDDING, h)
    if embedding_kind is None:  # a float table: held apart unless tied to a packed head, whose rows it reads
        separate = 0 if tied and packed else config.vocab_size * h * (2 if EMBEDDING in half else width)
        return total, separate, bool(quantized)
    return total, 0 if tied else packed_bytes(embedding_kind, config.vocab_size, h), bool(quantized)
