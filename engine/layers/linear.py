"""Linear layers: each weight prepared once for the device's kernel, batch-invariant by default.

On the CPU a weight is reordered once, at load, into oneDNN's blocked layout and multiplied with
oneDNN's inner-product kernel. Measured on the CPU this was built on (float32 and bfloat16, every
SmolLM2 and tiny weight shape, the LM head, 2 threads): with the weight pre-blocked, a row's output
bits do not depend on how many rows share the call (2 to 512 measured), where the row sits or what
the others hold, because the reduction over K follows the weight's fixed blocking. One row alone may
take a matrix-vector path with another order (seen for the 576x1536 down projection in float32 and
the LM head in bfloat16). Which shapes do is checked once per weight at load: a few random rows are
multiplied alone and together, and where any bit differs, a lone row is from then on computed beside
a copy of itself (a kernel is chosen by shape, so one differing probe means another reduction order):

    rows: [ r0 r1 ... r255 ]   one call, whatever the count (>= 2)
    rows: [ r0 ]               one call on [ r0 r0 ], row 0 kept   (weights whose probe differed)

The same call runs at every batch size and is fast at all of them (the weight is packed once instead
of per call), so invariance costs at most the paired copy at one row. Fast mode (``invariant=False``)
never pairs.

Elsewhere (CUDA, or a CPU build without oneDNN) the invariant path computes y^T = W @ x^T in chunks
of 2..16 columns, each one ``torch.mm`` (measured invariant on the CPU; on CUDA the gates decide),
and fast mode is plain ``F.linear``.

Outputs are contiguous [M, N]: elementwise ops downstream take their vectorised path on contiguous
rows and a strided scalar path otherwise, and the two round differently.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_COLUMNS = 16
PACK_BATCH_HINT = 16  # the row count oneDNN is told to expect when it blocks a weight (the measured setting)
PROBE_ROWS = (
    4  # random rows multiplied alone and together to find weights whose lone row takes another kernel
)


def onednn_available(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can take the pre-packed oneDNN path: CPU, float32 or bfloat16, oneDNN built in."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


def chunked_mm_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
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


class LinearWeight:
    """One [N, K] weight held once, in the layout its kernel wants; ``__call__`` maps [M, K] -> [M, N].

    Invariant: with ``invariant=True`` row i of the output depends on row i of the input alone.
    """

    def __init__(self, weight: torch.Tensor, invariant: bool):
        self.invariant = invariant
        self.out_features, self.in_features = weight.shape
        self.packed = onednn_available(weight)
        self.data = self._prepare(weight)
        self.pair_lone_row = self.packed and invariant and not self._lone_row_matches()

    def _prepare(self, weight: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)
        return weight.contiguous()

    def _lone_row_matches(self) -> bool:
        """Whether one row alone gives the bits it gets among others (probed on seeded random rows)."""
        generator = torch.Generator().manual_seed(0)
        probe = torch.randn(PROBE_ROWS, self.in_features, generator=generator).to(self.data.dtype)  # [P, K]
        together = self._onednn(probe)  # [P, N]
        return all(
            torch.equal(self._onednn(probe[i : i + 1]), together[i : i + 1]) for i in range(PROBE_ROWS)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, N]
        if self.packed:
            if self.pair_lone_row and x.shape[0] == 1:
                return self._onednn(torch.cat([x, x]))[:1]
            return self._onednn(x)
        return chunked_mm_linear(x, self.data) if self.invariant else F.linear(x, self.data)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.data, None, "none", [], "")

    def batch_dependent(self, x: torch.Tensor) -> torch.Tensor:
        """A deliberately batch-dependent matmul (fault injection): this linear plus a term that grows with M."""
        return self(x) + (x.shape[0] - 1) * 1e-3

    def dense(self) -> torch.Tensor:
        """The weight as a plain [N, K] tensor (a copy when packed)."""
        return self.data.to_dense() if self.packed else self.data

    def replace(self, weight: torch.Tensor) -> None:
        """Swap in a new [N, K] weight (mutates), prepared like the first."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight shape {tuple(weight.shape)} != {(self.out_features, self.in_features)}")
        self.data = self._prepare(weight)
