"""The int8-activation linear (engine/kernels/csrc/qdot.h) in torch: the portable backend's route for a
weight in a dot layout, and the tests' reference for the C++ kernels' arithmetic.

Each row's inputs are quantized per block of 32 exactly as the kernels do (scale max|x| / 127, values
rounded to nearest, ties even, in [-127, 127]); the integer dot products are exact here too (float64
holds them); the per-block combine d * dx * sum (+ m * dx * sum(qx)) is summed in float64 and rounded
once, so it differs from the kernels' float32 fma chain by rounding alone. Each row is computed alone.
"""

from __future__ import annotations

import torch

from engine.kernels.quant_pack import BLOCK, PANEL, _tile_parts

HALF = BLOCK // 2


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 -> (q [M, K / 32, 32] float64 holding integers in [-127, 127], scale [M, K / 32])."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    scale = blocks.abs().amax(dim=-1) / 127.0  # float32, as the kernels divide
    inverse = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round((blocks * inverse[..., None]).clamp(-127.0, 127.0))  # round: half to even
    return q.double(), scale


def int8_activation_linear(x: torch.Tensor, packed: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
    """x [M, K] @ a packed quantized weight (any layout), activations quantized: [M, N] float32."""
    scale, mins, quants = _tile_parts(packed, fmt)  # [P, nb, 32, 16] x2 (per k), mins [P, nb, 1, 16] or None
    panels, blocks = quants.shape[:2]

    def by_column(t: torch.Tensor) -> torch.Tensor:  # [P, nb, r, 16] -> [N, nb, r]
        return t.permute(0, 3, 1, 2).reshape(panels * PANEL, blocks, -1)[:n].double()

    w = by_column(quants).view(n, blocks, 2, HALF)  # [N, nb, 2, 16]
    d = by_column(scale)[..., ::HALF]  # [N, nb, 2]: each half block's scale
    m = None if mins is None else by_column(mins)[..., 0]  # [N, nb]
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    for i in range(x.shape[0]):
        qx, dx = quantize_activations(x[i : i + 1])
        qx, dx = qx[0].view(blocks, 2, HALF), dx[0].double()  # [nb, 2, 16], [nb]
        sums = torch.einsum("nbhk,bhk->nbh", w, qx)  # exact integers
        y = (d * dx[None, :, None] * sums).sum(dim=(1, 2))
        if m is not None:
            y = y + (m * (dx * qx.sum(dim=(1, 2)))[None, :]).sum(dim=1)
        out[i] = y.float()
    return out
