"""A weight kept in its GGUF block format, from the file (or quantized at load), never widened in memory.

One record whatever its source: the ggml type, the raw blocks exactly as GGUF stores them, one row of
blocks per output row, and the logical [N, K] shape. The loader fills it from a file's tensors;
``quantize_q8_0`` makes one from a float weight (``--quantize int8``); engine/layers/linear.py packs it
for the kernels (engine/kernels/csrc/quantized.h), which compute with exactly the values
``dequantize`` gives (gguf's own reference dequantizer).

    blocks  [N, K / block, block bytes] uint8  Q8_0: f16 d, 32 x int8             (34 bytes per 32)
                                               Q4_0: f16 d, 16 bytes of nibbles   (18 bytes per 32)
                                               Q4_1: f16 d, f16 m, 16 bytes       (20 bytes per 32)
                                               Q5_0: f16 d, 4 bytes of fifth bits, 16 bytes (22)
                                               Q5_1: f16 d, f16 m, 4 bytes of fifth bits, 16 (24)
                                               Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and
                                                     mins, 128 bytes of nibbles   (144 bytes per 256)
                                               Q5_K: as Q4_K, with 32 bytes of fifth bits before
                                                     the nibbles                  (176 bytes per 256)
                                               Q6_K: 128 bytes low nibbles, 64 bytes high 2 bits,
                                                     16 int8 scales, f16 d        (210 bytes per 256)
                                               IQ4_NL: f16 d, 16 bytes of nibbles, each an
                                                     index into 16 int8 values   (18 bytes per 32)
                                               IQ4_XS: f16 d, 8 bytes of 6-bit sub-scales,
                                                     128 bytes of nibbles as IQ4_NL's (136 per 256)
                                               Q3_K: 32 bytes of third bits, 64 of 2-bit values,
                                                     12 of 6-bit scales, f16 d    (110 bytes per 256)
                                               Q2_K: 16 bytes of 4-bit scales and mins, 64 of
                                                     2-bit values, f16 d, f16 dmin (84 bytes per 256)
    nibbles (Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL): byte j of a block holds element j in its low nibble and element j + 16 in its
    high one. The K types' layouts are gguf's (gguf.quants.Q4_K / Q5_K / Q6_K); quant_pack.py reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import torch

from engine.quant_layout import BLOCK, BLOCK_BYTES, BLOCK_ELEMENTS, QTYPES  # noqa: F401 - its types


@dataclass(frozen=True)
class QuantizedWeight:
    """A [N, K] weight as GGUF blocks. Invariant: ``blocks.shape == (N, K // BLOCK_ELEMENTS[qtype],
    BLOCK_BYTES[qtype])``."""

    qtype: str
    blocks: torch.Tensor  # [N, K / block elements, block bytes] uint8
    shape: tuple[int, int]  # (N, K): N output rows, K inputs

    def __post_init__(self) -> None:
        if self.qtype not in BLOCK_BYTES:
            raise ValueError(f"unsupported quantized type {self.qtype}; supported: {', '.join(QTYPES)}")
        n, k = self.shape
        elements = BLOCK_ELEMENTS[self.qtype]
        expected = (n, k // elements, BLOCK_BYTES[self.qtype])
        if k % elements or tuple(self.blocks.shape) != expected or self.blocks.dtype != torch.uint8:
            raise ValueError(
                f"{self.qtype} blocks of a {n}x{k} weight must be uint8 {expected}, got "
                f"{self.blocks.dtype} {tuple(self.blocks.shape)}"
            )

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def dequantize(self) -> torch.Tensor:
        """The [N, K] float32 weight, as gguf's reference dequantizer gives it."""
        raw = self.blocks.reshape(self.shape[0], -1).numpy()
        values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[self.qtype])
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(self.shape)

    def take_rows(self, order: torch.Tensor) -> QuantizedWeight:
        """Rows reordered (or selected) by ``order`` [n'] long: blocks are per row, so this is exact."""
        return QuantizedWeight(
            self.qtype, self.blocks[order].contiguous(), (int(order.numel()), self.shape[1])
        )

    @staticmethod
    def stack(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """Rows of several weights of one type and K, one after another (a fused q|k|v, gate|up)."""
        qtype, k = parts[0].qtype, parts[0].shape[1]
        if any(p.qtype != qtype or p.shape[1] != k for p in parts):
            raise ValueError("only weights of one quantized type and input width stack")
        rows = sum(p.shape[0] for p in parts)
        return QuantizedWeight(qtype, torch.cat([p.blocks for p in parts]), (rows, k))


def quantize_q8_0(weight: torch.Tensor) -> QuantizedWeight:
    """A float [N, K] weight (K a multiple of 32) as Q8_0 blocks, by gguf's reference quantizer."""
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"Q8_0 needs K a multiple of {BLOCK}, got {k}")
    raw = gguf.quants.quantize(weight.float().numpy(), gguf.GGMLQuantizationType.Q8_0)  # [N, K / 32 * 34]
    blocks = torch.from_numpy(np.ascontiguousarray(raw)).view(n, k // BLOCK, BLOCK_BYTES["Q8_0"])
    return QuantizedWeight("Q8_0", blocks, (n, k))


def dense(weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """A weight as a plain float tensor (a quantized one dequantized to float32)."""
    return weight.dequantize() if isinstance(weight, QuantizedWeight) else weight


# where each type gguf only reads (no quantizer) keeps its float16 (super-)block scales; the rest of a
# block is any bytes
SCALE_FIELDS = {
    "Q4_K": (0, 2),
    "Q6_K": (208,),
    "Q5_K": (0, 2),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "Q3_K": (108,),
    "Q2_K": (80, 82),
}


def sample_weight(
    qtype: str, n: int, k: int, generator: torch.Generator, scale: float = 1.0
) -> QuantizedWeight:
    """A [n, k] weight of ``qtype`` for tests and gates: gguf's quantizer over normal values where it has
    one; for the K types (gguf only reads them) random bytes with sane float16 super-block scales (every
    byte pattern is a valid block)."""
    shape = (n, k // BLOCK_ELEMENTS[qtype], BLOCK_BYTES[qtype])
    if qtype in SCALE_FIELDS:
        raw = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
        for at in SCALE_FIELDS[qtype]:
            d = (torch.rand(n, shape[1], generator=generator) * 0.05 * scale).half()
            raw[..., at : at + 2] = d.unsqueeze(-1).view(torch.uint8)
        return QuantizedWeight(qtype, raw, (n, k))
    values = (torch.randn(n, k, generator=generator) * scale).numpy()
    blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType[qtype])
    return QuantizedWeight(qtype, torch.from_numpy(blocks).view(shape), (n, k))
