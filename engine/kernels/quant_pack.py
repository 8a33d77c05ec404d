"""The packed layout of a quantized weight for engine/kernels/csrc/quantized.h, and its way back.

    blocks [N, K / 32, block bytes]  ->  packed [P, K / 32, tile bytes] uint8,  P = ceil(N / 16)

Per panel of 16 output rows and block of 32 inputs, one tile of as many bytes as the 16 GGUF blocks it
holds: the 16 rows' float16 scales d, for 4-bit types their float16 offsets m (Q4_1's own min, Q4_0's
-8 d: exact), then the quants laid out by k, 16 columns side by side (Q8: one int8 each; Q4: byte j =
column j | column j+8 << 4). Rows past N are zero (weight 0). Every value the kernels compute from a
tile, q * d (+ m), is exactly gguf's dequantized value: the products are exact in float32.
"""

from __future__ import annotations

import torch

from engine.quantized import BLOCK, QuantizedWeight

PANEL = 16
Q8, Q4 = 0, 1  # quantized.h QFormat
FORMAT_OF = {"Q8_0": Q8, "Q4_0": Q4, "Q4_1": Q4}
SCALE_BYTES = PANEL * 2  # 16 float16 scales (or mins)
TILE_BYTES = {Q8: SCALE_BYTES + BLOCK * PANEL, Q4: 2 * SCALE_BYTES + BLOCK * PANEL // 2}


def packed_bytes(qtype: str, n: int, k: int) -> int:
    """Bytes a quantized [N, K] weight of ``qtype`` occupies packed."""
    return -(-n // PANEL) * (k // BLOCK) * TILE_BYTES[FORMAT_OF[qtype]]


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes (little-endian float16) -> [...] float16."""
    return raw.contiguous().view(torch.float16).squeeze(-1)


def _by_panel(t: torch.Tensor, panels: int) -> torch.Tensor:
    """[N, ...] -> [P, 16, ...], rows past N zero."""
    padded = torch.zeros((panels * PANEL, *t.shape[1:]), dtype=t.dtype)
    padded[: t.shape[0]] = t
    return padded.view(panels, PANEL, *t.shape[1:])


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[P, nb, ...] of any dtype -> [P, nb, bytes] uint8."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], t.shape[1], -1)


def pack_quantized(weight: QuantizedWeight) -> tuple[int, torch.Tensor]:
    """(format, packed [P, K / 32, tile bytes] uint8) of a quantized [N, K] weight."""
    n, k = weight.shape
    panels, blocks = -(-n // PANEL), k // BLOCK
    raw = weight.blocks  # [N, nb, block bytes]
    d = _by_panel(_f16(raw[..., 0:2]), panels).transpose(1, 2)  # [P, nb, 16]
    if weight.qtype == "Q8_0":
        q = _by_panel(raw[..., 2:].contiguous().view(torch.int8), panels)  # [P, 16, nb, 32]
        quants = q.permute(0, 2, 3, 1)  # [P, nb, 32, 16]
        return Q8, torch.cat([_as_bytes(d), _as_bytes(quants)], dim=-1)
    nibbles = raw[..., -BLOCK // 2 :]  # [N, nb, 16]
    values = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # [N, nb, 32], element order
    m = _f16(raw[..., 2:4]) if weight.qtype == "Q4_1" else None
    if m is None:  # Q4_0: w = d (q - 8) = q d + (-8 d); -8 d is exact in float16 unless it overflows
        m_panels = d * -8.0
        if not bool(torch.isfinite(m_panels).all()):
            raise ValueError("a Q4_0 block scale is too large to hold -8 d in float16")
    else:
        m_panels = _by_panel(m, panels).transpose(1, 2)  # [P, nb, 16]
    v = _by_panel(values, panels).permute(0, 2, 3, 1)  # [P, nb, 32, 16]
    packed_nibbles = v[..., : PANEL // 2] | (v[..., PANEL // 2 :] << 4)  # [P, nb, 32, 8]
    assert packed_nibbles.shape[1] == blocks
    return Q4, torch.cat([_as_bytes(d), _as_bytes(m_panels), _as_bytes(packed_nibbles)], dim=-1)


def _tile_parts(tiles: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """tiles [..., nb, tile bytes] -> d [..., nb, 16], m [..., nb, 16] or None, quants [..., nb, 32, 16]."""
    lead = tiles.shape[:-1]
    d = tiles[..., :SCALE_BYTES].contiguous().view(torch.float16).float()
    if fmt == Q8:
        q = tiles[..., SCALE_BYTES:].contiguous().view(torch.int8).reshape(*lead, BLOCK, PANEL)
        return d, None, q.float()
    m = tiles[..., SCALE_BYTES : 2 * SCALE_BYTES].contiguous().view(torch.float16).float()
    by = tiles[..., 2 * SCALE_BYTES :].reshape(*lead, BLOCK, PANEL // 2)
    return d, m, torch.cat([by & 0x0F, by >> 4], dim=-1).float()


def _values(d: torch.Tensor, m: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """q * d (+ m) per column, as the kernels compute it: [..., nb, 32, 16] float32."""
    w = q * d.unsqueeze(-2)
    return w if m is None else w + m.unsqueeze(-2)


def unpack_quantized(packed: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
    """The [N, K] float32 weight the kernels multiply by (gguf's dequantized values)."""
    panels, blocks, _ = packed.shape
    w = _values(*_tile_parts(packed, fmt))  # [P, nb, 32, 16]
    return w.permute(0, 3, 1, 2).reshape(panels * PANEL, blocks * BLOCK)[:n].contiguous()


def quantized_rows(packed: torch.Tensor, fmt: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` [T] long of the weight, dequantized: [T, K] float32 (an embedding lookup)."""
    d, m, q = _tile_parts(packed[ids // PANEL], fmt)  # [T, nb, 16], ..., [T, nb, 32, 16]
    col = (ids % PANEL).view(-1, 1, 1)
    d = d.gather(2, col.expand(-1, d.shape[1], 1))  # [T, nb, 1]
    m = None if m is None else m.gather(2, col.expand(-1, m.shape[1], 1))
    q = q.gather(3, col.unsqueeze(-1).expand(-1, q.shape[1], BLOCK, 1))  # [T, nb, 32, 1]
    w = _values(d, m, q)  # [T, nb, 32, 1]
    return w.reshape(ids.numel(), -1)
