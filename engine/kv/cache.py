"""The KV tensors, allocated once up front: per layer, K and V of [num_blocks, kv_heads, block_size, head_dim]."""

from __future__ import annotations

import torch

from engine.model_config import ModelConfig


class KVCache:
    """All layers' K and V blocks. ``bytes`` is known before the first request."""

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ):
        shape = (num_blocks, config.num_kv_heads, block_size, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.block_size = block_size

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def rows_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows of the [num_blocks * kv_heads * block_size, head_dim] view that flat slots (block *
        block_size + offset) occupy, head by head: [T * kv_heads] long (compute once per step)."""
        heads = self.keys[0].shape[1]
        block = torch.div(slots, self.block_size, rounding_mode="floor")
        first = block * heads * self.block_size + slots % self.block_size  # [T]: head 0's row
        offsets = torch.arange(heads, device=slots.device) * self.block_size  # [kv_heads]
        return (first[:, None] + offsets[None, :]).reshape(-1)

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V at ``rows`` (from ``rows_of``). k, v: [T, kv_heads, head_dim], converted to the
        cache's dtype (a float16 cache of a float32 model: rounded to nearest, ties to even)."""
        # index_copy_ is ~100x faster than advanced-index assignment here
        dim, dtype = k.shape[2], self.keys[layer].dtype
        self.keys[layer].view(-1, dim).index_copy_(0, rows, k.reshape(-1, dim).to(dtype))
        self.values[layer].view(-1, dim).index_copy_(0, rows, v.reshape(-1, dim).to(dtype))

    def swap_blocks(self, a: int, b: int) -> None:
        """Exchange the contents of two blocks in every layer (fault injection only)."""
        for t in self.keys + self.values:
            t[[a, b]] = t[[b, a]]
