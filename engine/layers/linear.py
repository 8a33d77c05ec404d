"""Linear layers, batch-invariant by construction.

``invariant_linear`` pads the rows to whole tiles of TILE_ROWS and multiplies every tile with the
same fixed-shape ``bmm`` against the (stride-0 expanded) weight. The kernel, its blocking and its
reduction order are fixed by the tile shape, so a row's bits do not depend on how many rows share the
call, where the row sits, or what the other rows hold. Measured on the CPU this was built on:

    rows:   [ r0 r1 ... r15 | r16 ... r31 | r32 pad pad ... ]   one bmm, every tile [16, K] x [K, N]

Plain ``F.linear`` is not invariant (the library picks kernels and reduction splits by M).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TILE_ROWS = 16


def invariant_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [M, K] @ weight: [N, K]^T -> [M, N], each row computed in a fixed [16, K] tile."""
    rows, k = x.shape
    tiles = -(-rows // TILE_ROWS)
    padded = tiles * TILE_ROWS
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, k)])
    out = torch.bmm(x.view(tiles, TILE_ROWS, k), weight.t().unsqueeze(0).expand(tiles, k, weight.shape[0]))
    return out.view(padded, weight.shape[0])[:rows]  # [M, N]


def batch_dependent_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A deliberately batch-dependent matmul (fault injection): plain F.linear plus a term that grows with M."""
    return F.linear(x, weight) + (x.shape[0] - 1) * 1e-3


def linear(x: torch.Tensor, weight: torch.Tensor, invariant: bool) -> torch.Tensor:
    """The engine's matmul: invariant tiles by default, plain F.linear in fast mode."""
    return invariant_linear(x, weight) if invariant else F.linear(x, weight)
