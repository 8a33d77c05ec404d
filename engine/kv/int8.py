"""The int8 KV cache's values, in torch: each token's head vector of d values in groups of GROUP (the last
group shorter where d is not a multiple), each group one float16 scale and its values as int8.

    s = float16(min(amax / 127, 65504))           amax: the group's largest |x|; rounded to nearest even
    q = clamp(round_half_even(x / s), -127, 127)  (0 where s is 0)

A value reads back as q * s, exact in float32 (8 significant bits times 11), so attention over an int8
cache equals attention over a float32 cache of the values q * s, bit for bit. A token's scales are its
own (never a scale per paged block, which would change as the block fills and with the chunking): a
token's bits never depend on its block, its batch or when it was written. engine/kernels/csrc/kv_int8.h
quantizes the same way in the C++ layer loop (the tests compare the two).
"""

from __future__ import annotations

import torch

from engine.kv.int8_layout import GROUP, groups

__all__ = ["GROUP", "dequantize", "groups", "quantize"]

LARGEST_SCALE = 65504.0  # float16's largest finite value


def _grouped(x: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., groups, GROUP], zero padded past d."""
    d = x.shape[-1]
    padded = torch.nn.functional.pad(x, (0, groups(d) * GROUP - d))
    return padded.view(*x.shape[:-1], groups(d), GROUP)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] float32 -> (q [..., d] int8, scales [..., groups(d)] float16): the module's rule."""
    d = x.shape[-1]
    grouped = _grouped(x.float())  # [..., groups, GROUP]
    amax = grouped.abs().amax(dim=-1)  # [..., groups]
    scales = torch.clamp(amax / 127.0, max=LARGEST_SCALE).to(torch.float16)
    s = scales.float().unsqueeze(-1)  # [..., groups, 1]
    ratio = torch.where(s == 0, torch.zeros_like(grouped), grouped / s)
    q = torch.round(ratio).clamp(-127, 127).to(torch.int8)
    return q.view(*x.shape[:-1], -1)[..., :d].contiguous(), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(q [..., d] int8, scales [..., groups(d)] float16) -> [..., d] float32, q * s (exact)."""
    d = q.shape[-1]
    wide = scales.float().repeat_interleave(GROUP, dim=-1)[..., :d]  # [..., d]
    return q.float() * wide
