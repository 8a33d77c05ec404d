"""The integer-activation linear (engine/kernels/csrc/qdot.h) in torch: the portable backend's route for
a weight in a dot layout, and the tests' reference for the C++ kernels' arithmetic.

Each row's inputs are quantized per block of 32 exactly as the kernels do (scale max|x| / L, values
rounded to nearest, ties even, in [-L, L]; L = 127 for int8, 32767 for int16); the integer dot products
are exact here too (float64 holds them); the per-block combine d * dx * sum (+ m * dx * sum(qx)) is
summed in float64 and rounded once, so it differs from the kernels' float32 fma chain by rounding
alone. Each row is computed alone.
"""

from __future__ import annotations

import torch

from engine.kernels.quant_pack import BLOCK, PANEL, WIDE, _tile_parts

HALF = BLOCK // 2
INT8_LIMIT, INT16_LIMIT = 127.0, 32767.0


def activation_limit(fmt: int) -> float:
    """The largest quantized input a dot-layout format's activations hold (127 or 32767)."""
    return INT16_LIMIT if fmt >= WIDE else INT8_LIMIT


def quantize_activations(x: torch.Tensor, limit: float = INT8_LIMIT) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 -> (q [M, K / 32, 32] float64 holding integers in [-limit, limit], scale [M, K / 32])."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    scale = blocks.abs().amax(dim=-1) / limit  # float32, as the kernels divide
    inverse = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round((blocks * inverse[..., None]).clamp(-limit, limit))  # round: half to even
    return q.double(), scale


def integer_activation_linear(x: torch.Tensor, packed: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
    """x [M, K] @ a packed quantized weight in a dot layout, activations quantized: [M, N] float32."""
    scale, mins, quants = _tile_parts(
        packed, fmt
    )  # [P, nb, 32, 16] x2 (per k), mins [P, nb, 1 or 32, 16] or None
    panels, blocks = quants.shape[:2]
    limit = activation_limit(fmt)

    def by_column(t: torch.Tensor) -> torch.Tensor:  # [P, nb, r, 16] -> [N, nb, r]
        return t.permute(0, 3, 1, 2).reshape(panels * PANEL, blocks, -1)[:n].double()

    w = by_column(quants).view(n, blocks, 2, HALF)  # [N, nb, 2, 16]
    d = by_column(scale)[..., ::HALF]  # [N, nb, 2]: each half block's scale
    m = None if mins is None else by_column(mins)[..., ::HALF]  # [N, nb, 1 or 2]: the block's min or halves
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    for i in range(x.shape[0]):
        qx, dx = quantize_activations(x[i : i + 1], limit)
        qx, dx = qx[0].view(blocks, 2, HALF), dx[0].double()  # [nb, 2, 16], [nb]
        sums = torch.einsum("nbhk,bhk->nbh", w, qx)  # exact integers
        y = (d * dx[None, :, None] * sums).sum(dim=(1, 2))
        if m is not None:
            halves = qx.sum(dim=2) if m.shape[-1] == 2 else qx.sum(dim=(1, 2)).unsqueeze(-1)  # [nb, 2 or 1]
            y = y + (m * (dx[:, None] * halves)[None]).sum(dim=(1, 2))
        out[i] = y.float()
    return out
