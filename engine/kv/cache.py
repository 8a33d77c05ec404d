"""The KV tensors, allocated once up front: per layer, K and V of [num_blocks, kv_heads, block_size, head_dim].

On the CPU, K is held by dimension: its storage is [num_blocks, kv_heads, head_dim, block_size] (a block's
keys side by side at each dimension, the layout attention's scores read 16 keys at a time) and ``keys[n]``
is that storage's transpose(2, 3) view, the same [num_blocks, kv_heads, block_size, head_dim] shape as V.
The kernels tell the layouts apart by strides (engine/kernels/csrc/cache_layout.h), torch code indexes the
view as it is. Elsewhere (CUDA) K is held by row, as V is.

On the CPU the pool is one zeroed allocation from calloc (numpy's zeros): at these sizes the C library
maps fresh pages, which the kernel zero-fills when first written, so the pool costs no time at load and
its pages join the process as requests fill them (torch.zeros wrote every byte: 1.2-2.2 s for a 3B
model's 1.9 GB pool). Every layer's K and V are views of it.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

from engine.model_config import ModelConfig


class KVCache:
    """All layers' K and V blocks. ``bytes`` is known before the first request."""

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ):
        shape = (num_blocks, config.num_kv_heads, block_size, config.head_dim)
        pool = _zeros(2 * config.num_layers, shape, dtype, device)  # [2 x layers, *shape]
        self.keys_by_dimension = device.type == "cpu"
        if (
            self.keys_by_dimension
        ):  # [blocks, kv_heads, d, block] storage, seen as [blocks, kv_heads, block, d]
            by_dimension = pool[: config.num_layers].view(config.num_layers, *shape[:2], shape[3], shape[2])
            self._key_storage = list(by_dimension.unbind())
            self.keys = [t.transpose(2, 3) for t in self._key_storage]
        else:
            self.keys = list(pool[: config.num_layers].unbind())
            self._key_storage = self.keys
        self.values = list(pool[config.num_layers :].unbind())
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
        if self.keys_by_dimension:  # row r = (block * kv_heads + head) * block_size + offset
            by_head_block = self._key_storage[layer].view(
                -1, dim, self.block_size
            )  # [blocks x kv_heads, d, block]
            by_head_block[rows // self.block_size, :, rows % self.block_size] = k.reshape(-1, dim).to(dtype)
        else:
            self.keys[layer].view(-1, dim).index_copy_(0, rows, k.reshape(-1, dim).to(dtype))
        self.values[layer].view(-1, dim).index_copy_(0, rows, v.reshape(-1, dim).to(dtype))

    def fault_in(self) -> None:
        """Make every page of the pool resident now, as a pool that has held every block's K and V is:
        one value per page written as itself times one (exact for every value), so contents never change."""
        for t in self._key_storage + self.values:
            flat = t.view(-1)
            flat[:: max(mmap.PAGESIZE // t.element_size(), 1)].mul_(1)

    def swap_blocks(self, a: int, b: int) -> None:
        """Exchange the contents of two blocks in every layer (fault injection only)."""
        for t in self.keys + self.values:
            t[[a, b]] = t[[b, a]]


def _zeros(count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[count, *shape] zeros of ``dtype``; on the CPU one calloc'd allocation (the module docstring)."""
    if device.type != "cpu":
        return torch.zeros((count, *shape), dtype=dtype, device=device)
    nbytes = count * int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(count, *shape)
