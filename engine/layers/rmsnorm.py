"""Row-wise RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, rounded to x's dtype, then * weight.

Invariant (CPU): our kernel reduces each row over its own hidden dimension in a fixed order
(engine/kernels), whatever the row count; a library may split one row's reduction when rows are few.
Fast mode and other devices use torch's ``rms_norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, invariant: bool = True) -> torch.Tensor:
    # x: [T, hidden] -> [T, hidden] in x's dtype
    if invariant and x.device.type == "cpu":
        return kernels.rms_norm(x, eps).to(x.dtype) * weight
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * weight
