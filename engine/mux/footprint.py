"""A real model's memory footprint, computed from its files and engine settings, never guessed.

    total = weights + KV pool + activations
    weights          = bytes held as the engine holds them (engine/models/held_weights.py): quantized
                       weights as packed tiles, float ones x dtype bytes (a tied LM head once when
                       packed, its rows the lookup; twice when plain, off the invariant CPU kernels)
    KV pool          = num_kv_blocks x KV bytes per block (allocated up front, so known before any request)
    KV bytes / block = 2 (K and V) x num_layers x num_kv_heads x head_dim x block_size x dtype bytes
    activations      = a stated allowance (registry ``activation_mb``, CLI ``--activation-mb``)

The KV pool's tokens (num_kv_blocks x block_size) bound the context, and so does the model's
max_position_embeddings: ``context_tokens`` is the smaller of the two.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidRequestError
from engine.mux.model_spec import ModelSpec

if TYPE_CHECKING:
    from engine.loader import ModelSource
    from engine.model_config import ModelConfig


@dataclass(frozen=True)
class Footprint:
    """The bytes one loaded model holds, by part."""

    name: str
    dtype: str
    num_params: int
    weight_bytes: int
    block_size: int
    num_kv_blocks: int
    kv_bytes_per_block: int
    activation_bytes: int
    max_position_embeddings: int
    draft_bytes: int = 0  # a speculative draft model's weights and KV pool, held beside (engine/speculative)

    @property
    def kv_bytes(self) -> int:
        return self.num_kv_blocks * self.kv_bytes_per_block

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes + self.draft_bytes

    @property
    def held_bytes(self) -> int:
        """Weights plus KV pool (and a draft's): the tensor bytes the loaded model owns (activations
        come and go)."""
        return self.weight_bytes + self.kv_bytes + self.draft_bytes

    @property
    def context_tokens(self) -> int:
        return min(self.num_kv_blocks * self.block_size, self.max_position_embeddings)

    def max_kv_blocks(self, budget_bytes: int) -> int:
        """The most KV blocks that fit beside weights and activations under ``budget_bytes`` (0 if none)."""
        room = budget_bytes - self.weight_bytes - self.activation_bytes - self.draft_bytes
        return max(room // self.kv_bytes_per_block, 0)

    def max_context(self, budget_bytes: int) -> int:
        """The largest context (tokens) that fits alone under ``budget_bytes``; 0 if the weights do not."""
        return min(self.max_kv_blocks(budget_bytes) * self.block_size, self.max_position_embeddings)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "num_params": self.num_params,
            "weight_bytes": self.weight_bytes,
            "block_size": self.block_size,
            "num_kv_blocks": self.num_kv_blocks,
            "kv_bytes_per_block": self.kv_bytes_per_block,
            "kv_bytes": self.kv_bytes,
            "activation_bytes": self.activation_bytes,
            "draft_bytes": self.draft_bytes,
            "total_bytes": self.total_bytes,
            "context_tokens": self.context_tokens,
        }


def footprint_from_config(
    config: ModelConfig,
    dtype: str,
    num_kv_blocks: int,
    block_size: int,
    activation_bytes: int,
    name: str = "",
    quantize: str = "auto",
    kv_cache_dtype: str = "auto",
) -> Footprint:
    """The footprint of ``config`` as ``dtype`` (and ``quantize``), its KV pool ``num_kv_blocks`` x
    ``block_size`` tokens in ``kv_cache_dtype``'s dtype, on the CPU (on a GPU quantized weights are held
    dequantized: "none")."""
    from engine.models.held_weights import held_kv_dtype, held_weight_bytes

    if num_kv_blocks < 1 or block_size < 1 or activation_bytes < 0:
        raise InvalidRequestError(
            "num_kv_blocks and block_size must be >= 1 and the activation allowance >= 0"
        )
    kv_per_block = block_size * config.kv_bytes_per_token(
        held_kv_dtype(config, dtype, quantize, kv_cache_dtype)
    )
    return Footprint(
        name=name or config.name,
        dtype=dtype,
        num_params=config.num_params,
        weight_bytes=held_weight_bytes(config, dtype, quantize),
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        kv_bytes_per_block=kv_per_block,
        activation_bytes=activation_bytes,
        max_position_embeddings=config.max_position_embeddings,
    )


def footprint_of(
    source: str,
    dtype: str,
    num_kv_blocks: int,
    block_size: int,
    activation_bytes: int,
    name: str = "",
    quantize: str = "auto",
    kv_cache_dtype: str = "auto",
) -> Footprint:
    """Read ``source``'s config from its files (a named model, a folder or a .gguf); compute its footprint."""
    from engine.loader import resolve_model

    resolved = resolve_model(source)
    files = sorted(resolved.path.glob("*")) if resolved.path.is_dir() else [resolved.path]
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.is_file())
    config = _config(resolved, stamp)
    return footprint_from_config(
        config,
        dtype,
        num_kv_blocks,
        block_size,
        activation_bytes,
        name or resolved.name,
        quantize,
        kv_cache_dtype,
    )


@lru_cache(maxsize=32)
def _config(source: ModelSource, stamp: tuple[tuple[str, int, int], ...]) -> ModelConfig:
    """A model's config, read once per version of its files (``stamp``: path, mtime, size of each file).
    Reading a GGUF's metadata takes seconds; pools and plans ask for the same models again and again."""
    from engine.loader import load_config

    return load_config(source)


def footprint_of_spec(spec: ModelSpec) -> Footprint:
    """The footprint of a registry entry with a ``source``; its draft model's weights and KV pool are
    counted too where the entry speculates with one (``spec.engine.speculative == "draft"``)."""
    if spec.source is None:
        raise InvalidRequestError(f"model {spec.name!r} has a declared size, no files to measure")
    engine = spec.engine
    footprint = footprint_of(
        spec.source,
        engine.dtype,
        engine.num_kv_blocks,
        engine.block_size,
        spec.activation_bytes,
        spec.name,
        engine.quantize,
        engine.kv_cache_dtype,
    )
    if engine.speculative != "draft" or not engine.draft_model:
        return footprint
    return dataclasses.replace(footprint, draft_bytes=_draft_bytes(spec, engine.draft_model))


def _draft_bytes(spec: ModelSpec, draft_model: str) -> int:
    """The draft's weights, held as the target's dtype and quantize say, and its KV pool (as many
    blocks as the target's)."""
    from engine.loader import load_config
    from engine.models.held_weights import held_kv_dtype, held_weight_bytes
    from engine.speculative.footprint import draft_config

    assert spec.source is not None  # footprint_of_spec refused an entry without one
    engine = spec.engine
    draft = draft_config(draft_model, load_config(spec.source))
    weights = held_weight_bytes(draft, engine.dtype, engine.quantize)
    kv_dtype = held_kv_dtype(draft, engine.dtype, engine.quantize, engine.kv_cache_dtype)
    return weights + engine.num_kv_blocks * engine.block_size * draft.kv_bytes_per_token(kv_dtype)
