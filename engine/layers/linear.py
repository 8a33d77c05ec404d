"""Linear layers: each weight prepared once for its kernel, batch-invariant by default.

On the CPU the invariant path is our own kernel (engine/kernels): the weight is packed once, at load,
into panels of 16 output columns, and every output is one fused multiply-add chain over K in index
order, whatever the row count, the row's place among the others or the thread count:

    weight [N, K]  ->  packed [P, K, 16]       P = ceil(N / 16), zero-padded
    y[m, n] = fma(x[m, K-1], w[n, K-1], ... fma(x[m, 1], w[n, 1], x[m, 0] * w[n, 0]) ...)

A bfloat16 or float16 weight is packed as it is (half the bytes of float32) and widened in registers
as it is read, exactly: its outputs are the float32 path's over the widened weight, bit for bit.

A weight kept quantized (engine/quantized.py: GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, or ``--quantize int8``) is packed
once into tiles of 16 columns x 32 inputs (engine/kernels/quant_pack.py) and multiplied by the same
chains with each weight dequantized in registers to exactly its float value: its outputs are those of
the float32 path over the dequantized weight, bit for bit, in fast mode too (no library kernel reads
our blocks). With integer ``activations`` (EngineConfig.activations "int8" or "int16") the tiles are held
in the dot layout and each row's inputs are quantized per 32 to int8 or int16 (engine/kernels/csrc/qdot.h):
exact integer dot products and a fixed float combine per block, invariant by construction, a little off
the float path (int16: 256 times closer than int8). "mixed": int16, except the call's last
``context_rows`` rows, which take int8 (the same tiles; a row's format is its own, so still invariant).

Fast mode (``invariant=False``) is the library's ``F.linear`` on the plain weight.

Elsewhere (CUDA) the invariant path computes y^T = W @ x^T in chunks of 2..16 columns, each one
``torch.mm`` (on CUDA the gates decide whether it holds), and fast mode is plain ``F.linear``.

Outputs are contiguous [M, N] in the weight's dtype.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from engine import kernels
from engine.kernels.quant_pack import DOT, PANEL, pack_stacked, unpack_quantized
from engine.quantized import QuantizedWeight

CHUNK_COLUMNS = 16


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

    Invariant: with ``invariant=True`` (and always for a quantized weight) row i of the output depends
    on row i of the input alone. Outputs are in ``dtype`` (the engine's).
    """

    def __init__(
        self,
        weight: torch.Tensor | QuantizedWeight | list[torch.Tensor] | list[QuantizedWeight],
        invariant: bool,
        dtype: torch.dtype | None = None,
        activations: str = "float",
    ):
        """``weight``: one [N, K] weight, or parts [N_i, K] whose rows stack into it (a fused q|k|v or
        gate|up: all quantized of one type, or all float), read where they are, never stacked in memory
        first (the packers take the parts)."""
        parts = cast(
            "list[torch.Tensor] | list[QuantizedWeight]", weight if isinstance(weight, list) else [weight]
        )
        first = parts[0]
        self.invariant = invariant
        # a quantized weight: "int8"/"int16" quantize its inputs too (qdot.h); "mixed": int16, context rows int8
        self.activations = activations
        self.dtype = dtype or (first.dtype if isinstance(first, torch.Tensor) else torch.float32)
        self.out_features, self.in_features = sum(p.shape[0] for p in parts), first.shape[1]
        self.quantized: str | None = None  # the GGUF type when held quantized
        self.format = -1  # quant_pack format when quantized
        self.packed = False
        self.data = self._prepare(parts)

    def _prepare(self, parts: list[torch.Tensor] | list[QuantizedWeight]) -> torch.Tensor:
        if isinstance(parts[0], QuantizedWeight):
            quantized = cast("list[QuantizedWeight]", parts)
            self.quantized, self.packed = quantized[0].qtype, False
            self.format, packed = pack_stacked(quantized, self.activations)
            return packed  # [P, K / 32, tile bytes] uint8
        tensors = cast("list[torch.Tensor]", parts)
        self.quantized = None
        self.packed = self.invariant and tensors[0].device.type == "cpu"
        if self.packed:
            return kernels.pack_linear_weight(tensors)  # [P, K, 16], a 16-bit weight kept 16-bit
        whole = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
        return whole.to(self.dtype).contiguous()

    @property
    def context_format(self) -> int:
        """The format context rows multiply this weight in: int8 inputs under "mixed", else ``format``."""
        if self.quantized and self.activations == "mixed":
            return self.format - DOT
        return self.format

    def __call__(self, x: torch.Tensor, context_rows: int = 0) -> torch.Tensor:
        """x [M, K] -> [M, N]; its last ``context_rows`` rows in ``context_format``."""
        if self.quantized:
            own = x.shape[0] - context_rows if self.context_format != self.format else x.shape[0]
            y = kernels.qlinear(x[:own], self.data, self.format, self.out_features)
            if own < x.shape[0]:
                context = kernels.qlinear(x[own:], self.data, self.context_format, self.out_features)
                y = torch.cat([y, context])
            return y.to(self.dtype)
        if self.packed:
            return kernels.linear(x, self.data, self.out_features).to(self.dtype)
        return chunked_mm_linear(x, self.data) if self.invariant else F.linear(x, self.data)

    @property
    def kernel_layout(self) -> tuple[torch.Tensor, int] | None:
        """(data, format) as our C++ kernels read it: packed float panels (format -1) or packed
        quantized tiles (their quant_pack format); None when the weight is held plain."""
        if self.quantized:
            return self.data, self.format
        return (self.data, -1) if self.packed else None

    @property
    def kernel_segments(self) -> list[tuple[torch.Tensor, int, int, int]] | None:
        """Each part as the C++ layer loop takes it: (data, format, context format, output columns); one
        for a weight held whole (engine/layers/segmented_linear.py holds several); None when held plain."""
        layout = self.kernel_layout
        return None if layout is None else [(*layout, self.context_format, self.out_features)]

    def batch_dependent(self, x: torch.Tensor) -> torch.Tensor:
        """A deliberately batch-dependent matmul (fault injection): this linear plus a term that grows with M."""
        return self(x) + (x.shape[0] - 1) * 1e-3

    @property
    def nbytes(self) -> int:
        """Bytes the weight occupies as held (packed panels are padded to 16 columns)."""
        return self.data.numel() * self.data.element_size()

    def dense(self) -> torch.Tensor:
        """The weight as a plain [N, K] tensor in ``dtype`` (a copy when packed or quantized)."""
        if self.quantized:
            return unpack_quantized(self.data, self.format, self.out_features).to(self.dtype)
        if self.packed:
            return kernels.unpack_linear_weight(self.data, self.out_features, self.dtype)
        return self.data

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` [T] of the weight as [T, K] in ``dtype``: an embedding lookup in a tied head."""
        if self.quantized:
            return kernels.quantized_rows(self.data, self.format, ids).to(self.dtype)  # held on the CPU
        if self.packed:  # data [P, K, 16]: row n is column n % 16 of panel n // 16, copied as held, widened
            return self.data[ids // PANEL, :, ids % PANEL].to(self.dtype)
        return self.dense()[ids]

    def replace(self, weight: torch.Tensor) -> None:
        """Swap in a new [N, K] weight (mutates), held as a float weight in ``dtype`` from now on."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight shape {tuple(weight.shape)} != {(self.out_features, self.in_features)}")
        self.data = self._prepare([weight.to(self.dtype)])
