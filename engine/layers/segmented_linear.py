"""A fused linear whose parts the file holds in different quantized types, each held at its own size.

A Q4_K_M file keeps most of a layer in Q4_K and some of it in Q6_K: its q and k projections in Q4_K and
its v in Q6_K, say. Fusing them into one q|k|v weight would need one type, and no type holds both exactly,
so the fused linear is kept as segments: each run of consecutive parts of one type is a LinearWeight of
its own (packed at the file's size), and the fused output is their outputs side by side, columns in the
parts' order. Every output column is its own part's chain over k, so the bits are each part's alone,
the same as any fusion would give. The C++ layer loop takes the segments (DecoderStack.split_linear)
and writes each one's outputs into its columns.
"""

from __future__ import annotations

import itertools

import torch

from engine.layers.linear import LinearWeight
from engine.quantized import QuantizedWeight


class SegmentedLinear(LinearWeight):
    """Several LinearWeights of one input width, their outputs concatenated: [M, K] -> [M, sum N]."""

    def __init__(self, segments: list[LinearWeight]):  # pylint: disable=super-init-not-called
        if not segments or len({s.in_features for s in segments}) != 1:
            raise ValueError("segments of one input width, at least one")
        self.segments = segments
        first = segments[0]
        self.invariant, self.activations, self.dtype = first.invariant, first.activations, first.dtype
        self.out_features, self.in_features = sum(s.out_features for s in segments), first.in_features
        self.quantized = first.quantized
        self.format = first.format
        self.packed = False
        self.data = first.data

    @staticmethod
    def of_runs(
        parts: list[QuantizedWeight], invariant: bool, dtype: torch.dtype, activations: str
    ) -> SegmentedLinear:
        """The segments of ``parts`` (in order): each run of consecutive parts of one type, stacked."""
        runs = (list(run) for _, run in itertools.groupby(parts, key=lambda part: part.qtype))
        return SegmentedLinear([LinearWeight(run, invariant, dtype, activations) for run in runs])

    @property
    def context_format(self) -> int:
        return self.segments[0].context_format

    @property
    def types(self) -> list[str | None]:
        """Each segment's GGUF type, in order."""
        return [s.quantized for s in self.segments]

    def __call__(self, x: torch.Tensor, context_rows: int = 0) -> torch.Tensor:
        return torch.cat([s(x, context_rows) for s in self.segments], dim=1)

    @property
    def kernel_layout(self) -> tuple[torch.Tensor, int] | None:
        return None  # several tensors: the C++ layer loop takes them as segments (kernel_segments)

    @property
    def kernel_segments(self) -> list[tuple[torch.Tensor, int, int, int]] | None:
        parts = [s.kernel_segments for s in self.segments]
        return None if any(p is None for p in parts) else [seg for p in parts if p for seg in p]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def dense(self) -> torch.Tensor:
        return torch.cat([s.dense() for s in self.segments])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense()[ids]

    def replace(self, weight: torch.Tensor) -> None:
        """Swap in a new [N, K] weight, held as one float weight in ``dtype`` from now on."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight shape {tuple(weight.shape)} != {(self.out_features, self.in_features)}")
        self.segments = [LinearWeight(weight.to(self.dtype), self.invariant, self.dtype, self.activations)]
        self.quantized, self.format, self.data = None, -1, self.segments[0].data
