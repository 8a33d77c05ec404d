"""Linear layers, batch-invariant by construction.

``invariant_linear`` computes y^T = W @ x^T, the batch on the GEMM's column side, in chunks of at
most CHUNK_COLUMNS columns, each chunk one ``torch.mm`` call. Measured on the CPU this was built on
(float32 and bfloat16, every SmolLM2 weight shape and the LM head): with 2 to 16 columns the library
takes one kernel whose reduction over K does not depend on how many columns there are, where a
column sits, or what the others hold. One column alone takes a matrix-vector path with another
reduction order, so a lone row is computed beside a copy of itself. Beyond 16 columns the blocking
changes with the count, so larger batches are cut into chunks of 16:

    rows:  [ r0 .. r15 | r16 .. r31 | r32 r33 ]     three mm calls: W @ [K, 16], W @ [K, 16], W @ [K, 2]
    rows:  [ r0 ]                                   one mm call:    W @ [K, 2] with r0 twice

Plain ``F.linear`` (x @ W^T) is not invariant: the library picks kernels and splits by M. The
alternative measured in DESIGN.md (16-row ``bmm`` tiles) is invariant too, but pays 16 rows of work
for one.

Outputs are always contiguous [M, N]: elementwise ops downstream (SiLU, residual adds) take their
vectorised path on contiguous rows and a strided scalar path otherwise, and the two round differently.
Rows of a width that is a multiple of the vector length (every width of the models at hand) are then
computed element for element alike whatever M is; the gates check it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_COLUMNS = 16


def invariant_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [M, K] -> [M, N] for weight [N, K], every row through a W @ [K, c] call with 2 <= c <= 16."""
    rows = x.shape[0]
    if rows == 1:
        return torch.mm(weight, torch.cat([x, x]).t()).t()[:1].contiguous()  # [1, N]
    if rows <= CHUNK_COLUMNS:
        return torch.mm(weight, x.t()).t().contiguous()  # [M, N]
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, rows, CHUNK_COLUMNS):
        chunk = x[start : start + CHUNK_COLUMNS]
        if chunk.shape[0] == 1:
            chunk = torch.cat([chunk, chunk])
        out[start : start + CHUNK_COLUMNS] = torch.mm(weight, chunk.t()).t()[: rows - start]
    return out


def batch_dependent_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A deliberately batch-dependent matmul (fault injection): plain F.linear plus a term that grows with M."""
    return F.linear(x, weight) + (x.shape[0] - 1) * 1e-3


def linear(x: torch.Tensor, weight: torch.Tensor, invariant: bool) -> torch.Tensor:
    """The engine's matmul: invariant chunks by default, plain F.linear in fast mode."""
    return invariant_linear(x, weight) if invariant else F.linear(x, weight)
