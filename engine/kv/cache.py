"""The KV tensors, allocated once up front: per layer, K and V of [kv_heads, num_blocks, block_size, head_dim]."""

from __future__ import annotations

import torch

from engine.config import ModelConfig


class KVCache:
    """All layers' K and V blocks. ``bytes`` is known before the first request."""

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ):
        shape = (config.num_kv_heads, num_blocks, block_size, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.block_size = block_size

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V rows at flat slots (block * block_size + offset). k, v: [T, kv_heads, head_dim]."""
        # index_copy_ is ~100x faster than advanced-index assignment here
        heads, dim = k.shape[1], k.shape[2]
        self.keys[layer].view(heads, -1, dim).index_copy_(1, slots, k.transpose(0, 1))
        self.values[layer].view(heads, -1, dim).index_copy_(1, slots, v.transpose(0, 1))

    def swap_blocks(self, a: int, b: int) -> None:
        """Exchange the contents of two blocks in every layer (fault injection only)."""
        for t in self.keys + self.values:
            t[:, [a, b]] = t[:, [b, a]]
