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

from engine.errors import InvalidRequestError
from engine.kv import int8
from engine.model_config import ModelConfig


class KVCache:
    """All layers' K and V blocks. ``bytes`` is known before the first request.

    An int8 cache (``dtype`` torch.int8, the CPU only) holds each token's values with float16 scales per 32
    (engine/kv/int8.py): ``key_scales[n]`` and ``value_scales[n]`` [num_blocks, kv_heads, block_size,
    groups] laid out as ``keys[n]`` and ``values[n]`` are (K's by dimension); a float cache has none."""

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ):
        self.quantized = dtype == torch.int8
        if self.quantized and device.type != "cpu":
            raise InvalidRequestError(
                f"an int8 KV cache runs on the CPU kernels only; on {device.type} choose float16 or the model's dtype"
            )
        self.keys_by_dimension = device.type == "cpu"
        self.block_size = block_size
        shape = (num_blocks, config.num_kv_heads, block_size, config.head_dim)
        self.keys, self._key_storage, self.values = self._layers(config.num_layers, shape, dtype, device)
        self.key_scales: list[torch.Tensor] | None = None
        self.value_scales: list[torch.Tensor] | None = None
        self._key_scale_storage: list[torch.Tensor] = []
        if self.quantized:
            scale_shape = (*shape[:3], int8.groups(config.head_dim))
            self.key_scales, self._key_scale_storage, self.value_scales = self._layers(
                config.num_layers, scale_shape, torch.float16, device
            )

    def _layers(
        self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's K views, K storage and V tensors of ``shape`` [blocks, kv_heads, block, width],
        views of one zeroed pool; K by dimension where ``keys_by_dimension`` (the module docstring)."""
        pool = _zeros(2 * num_layers, shape, dtype, device)  # [2 x layers, *shape]
        values = list(pool[num_layers:].unbind())
        if not self.keys_by_dimension:
            keys = list(pool[:num_layers].unbind())
            return keys, keys, values
        # [blocks, kv_heads, width, block] storage, seen as [blocks, kv_heads, block, width]
        storage = list(pool[:num_layers].view(num_layers, *shape[:2], shape[3], shape[2]).unbind())
        return [t.transpose(2, 3) for t in storage], storage, values

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self) -> list[torch.Tensor]:
        """Every tensor of the pool (K as stored)."""
        return self._key_storage + self.values + self._key_scale_storage + (self.value_scales or [])

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``layer``'s K and V scales (an int8 cache), or (None, None)."""
        if self.key_scales is None or self.value_scales is None:
            return None, None
        return self.key_scales[layer], self.value_scales[layer]

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
        cache's dtype (a float16 cache of a float32 model: rounded to nearest, ties to even; an int8
        cache: quantized per 32 values, engine/kv/int8.py)."""
        k, v = k.reshape(len(rows), -1), v.reshape(len(rows), -1)  # [T x kv_heads, d]
        if self.key_scales is not None and self.value_scales is not None:
            (k, k_scales), (v, v_scales) = int8.quantize(k), int8.quantize(v)
            self._store(self._key_scale_storage[layer], rows, k_scales)
            self.value_scales[layer].view(-1, k_scales.shape[1]).index_copy_(0, rows, v_scales)
        self._store(self._key_storage[layer], rows, k)
        self.values[layer].view(-1, v.shape[1]).index_copy_(0, rows, v.to(self.values[layer].dtype))

    def _store(self, storage: torch.Tensor, rows: torch.Tensor, x: torch.Tensor) -> None:
        """x [R, width] into the K-layout ``storage`` at ``rows`` (by dimension on the CPU, else by row)."""
        width, x = x.shape[1], x.to(storage.dtype)
        if self.keys_by_dimension:  # row r = (block * kv_heads + head) * block_size + offset
            by_head_block = storage.view(-1, width, self.block_size)  # [blocks x kv_heads, width, block]
            by_head_block[rows // self.block_size, :, rows % self.block_size] = x
        else:  # index_copy_ is ~100x faster than advanced-index assignment here
            storage.view(-1, width).index_copy_(0, rows, x)

    def fault_in(self) -> None:
        """Make every page of the pool resident now, as a pool that has held every block's K and V is:
        one value per page written as itself times one (exact for every value), so contents never change."""
        for t in self._tensors():
            flat = t.view(-1)
            flat[:: max(mmap.PAGESIZE // t.element_size(), 1)].mul_(1)

    def swap_blocks(self, a: int, b: int) -> None:
        """Exchange the contents of two blocks in every layer (fault injection only)."""
        for t in self.keys + self.values + (self.key_scales or []) + (self.value_scales or []):
            t[[a, b]] = t[[b, a]]


def _zeros(count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[count, *shape] zeros of ``dtype``; on the CPU one calloc'd allocation (the module docstring)."""
    if device.type != "cpu":
        return torch.zeros((count, *shape), dtype=dtype, device=device)
    nbytes = count * int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(count, *shape)
