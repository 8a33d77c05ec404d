"""Row-wise RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, rounded to x's dtype, then * weight.

The one RMSNorm of the Python side: the paged model's layer-by-layer path and the reference call it.
Invariant (CPU): our kernel reduces each row over its own hidden dimension in a fixed order
(engine/kernels), whatever the row count; a library may split one row's reduction when rows are few.
Fast mode and other devices use torch's (engine/kernels/portable.py ``library_rms_norm``).
"""

from __future__ import annotations

import torch

from engine import kernels
from engine.kernels.portable import library_rms_norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, invariant: bool = True) -> torch.Tensor:
    """RMSNorm of the rows of ``x`` with ``weight``: ``invariant`` (on the CPU) through our kernel,
    otherwise through torch's."""
    # x: [T, D] (any leading dims off the kernel), weight: [D] -> x's shape and dtype
    if invariant and x.device.type == "cpu":
        return kernels.rms_norm(x, eps).to(x.dtype) * weight
    return library_rms_norm(x, eps).to(x.dtype) * weight
