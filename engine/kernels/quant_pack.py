"""The packed layout of a quantized weight for engine/kernels/csrc/quantized.h, and its way back.

    blocks [N, K / 32, block bytes]  ->  packed [P, K / 32, tile bytes] uint8,  P = ceil(N / 16)

Per panel of 16 output rows and block of 32 inputs, one tile of as many bytes as the 16 GGUF blocks it
holds: the 16 rows' float16 scales d, for 4-bit types their float16 offsets m (Q4_1's own min, Q4_0's
-8 d: exact), then the quants laid out by k, 16 columns side by side (Q8: one int8 each; Q4: byte j =
column j | column j+8 << 4). Rows past N are zero (weight 0). Every value the kernels compute from a
tile, q * d (+ m), is exactly gguf's dequantized value: the products are exact in float32.

Q4_K is held at the file's size as Q4S: per panel and super-block of 256 k (8 blocks), one super-tile
of as many bytes as the 16 GGUF blocks it holds (2304): a header of the 16 rows' float16 d and dmin, then
the high 2 bits of each block's 6-bit sub-scale and sub-min (one nibble a row per block: sc_hi | mn_hi <<
2, rows j and j + 8 in byte j's low and high nibble), then the 8 block tiles: the low 4 bits of each
row's sub-scale and sub-min (one byte: sc_lo | mn_lo << 4), then the nibbles as Q4. The kernels form a
block's d = d_super * sc and m = -(dmin * mn) in registers: float32 products that are exact (11 bits
times 6), so q * d + m is gguf's value. Q6_K is held at the file's size as Q8S: per panel and super-block
one super-tile of 3360 bytes (16 x 210): a header of the 16 rows' float16 D, then their 16 int8 sub-scales
(one per 16 k, [16 sub-blocks][16 rows]); then 8 block tiles of the 6-bit quants u = q + 32 in two planes,
the low 4 bits as Q4's nibbles (256 bytes) and the high 2 bits (128 bytes: row k's 4 bytes hold column c
at bits 2c of a little-endian word). The kernels form the half block's scale D * sc (exact: 11 bits times
8) and q = u - 32 in registers. Q5_K is held at the file's size as Q5S: Q4S with a fifth bit, each block
tile followed by a bit plane of 64 bytes (row k's 2 bytes hold column c at bit c of a little-endian
word), u = nibble | bit << 4: 2816 bytes per super-tile (16 x 176). IQ4_NL is held as I4, Q4's nibbles
under Q8's float16 scales, each nibble an index into IQ4's 16 int8 values (w = value * d, exact); IQ4_XS
at the file's size as I4S: per super-block one super-tile of 2176 bytes (16 x 136), a header of the 16
rows' float16 D and each block's 6-bit sub-scales (8 bytes of low nibbles, rows j and j + 8 in byte j;
4 bytes of high 2 bits, row c at bits 2 (c % 4) of byte c / 4), then the 8 blocks' nibbles as I4's;
w = value * D * (sc - 32), exact (11 bits times 6 times 7).

For integer activations (engine/kernels/csrc/qdot.h) the same tiles hold their quants in the dot
layout: k in quads of 4, each column's quad 4 bytes in a row (Q8: q ^ 0x80; Q4: quad j in the low
nibbles of chunk j, quad j + 4 in the high ones; Q8S: its low plane as Q4's, its high plane as 2 chunks
of 16 columns x 4 bytes, quad 4h + t's 2-bit values at bits 2t of chunk h; Q5S: its low plane as Q4's,
its bit plane as 16 columns x 4 bytes, quad j's bits at bit j). Same bytes, same scales. The format says which
inputs meet it: format + DOT int8 activations, format + WIDE (the same layout) int16 ones.

Packing runs at load, once per weight: in C++ (csrc/repack.h, one pass per panel from the GGUF blocks,
which it only reads) wherever the compiled kernels load, else in torch (pack_quantized_reference, pass by
pass: the definition of the bytes, which the tests hold the C++ packer to).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gguf
import numpy as np
import torch

from engine import kernels
from engine.quant_layout import (  # noqa: F401 - the layout's sizes, named here as the packers use them
    BLOCK,
    DOT,
    FORMAT_OF,
    GROUP,
    HEAD,
    I4,
    I4S,
    PANEL,
    Q2S,
    Q3S,
    Q4,
    Q4S,
    Q4Z,
    Q5,
    Q5S,
    Q5Z,
    Q8,
    Q8S,
    SCALE_BYTES,
    SIX_BIT_BYTES,
    SUPER,
    TILE_BYTES,
    WIDE,
    WIDE_SCALE_BYTES,
    packed_bytes,
    super_bytes,
)
from engine.quantized import QuantizedWeight

# EngineConfig.activations -> format offset ("mixed": int16, int8 for context rows, the same bytes)
ACTIVATION_OFFSET = {"float": 0, "int8": DOT, "int16": WIDE, "mixed": WIDE}
QUADS = BLOCK // 4
IQ4_VALUES = torch.tensor(gguf.quants.IQ4_NL.kvalues, dtype=torch.float32)  # a nibble's value
# the planes of a block tile's quants, low bits first: 8-bit bytes, nibbles, 2-bit values, 1-bit values
PLANES = {
    Q8: ("int8",),
    Q4: ("nibble",),
    Q4S: ("nibble",),
    Q8S: ("nibble", "two"),
    Q5S: ("nibble", "bit"),
    I4: ("nibble",),
    I4S: ("nibble",),
    Q3S: ("two", "bit"),
    Q2S: ("two",),
    Q5: ("nibble", "bit"),
    Q5Z: ("nibble", "bit"),
    Q4Z: ("nibble",),
}
PLANE_BITS = {"int8": 8, "nibble": 4, "two": 2, "bit": 1}
# a block tile's own scale bytes before its quants (Q4S, Q5S: the sub-scales' low bits)
HEADER_BYTES = {
    Q8: SCALE_BYTES,
    Q4: 2 * SCALE_BYTES,
    Q4S: PANEL,
    Q8S: 0,
    Q5S: PANEL,
    I4: SCALE_BYTES,
    I4S: 0,
    Q3S: 0,
    Q2S: 0,
    Q5: 2 * SCALE_BYTES,
    Q5Z: SCALE_BYTES,
    Q4Z: SCALE_BYTES,
}


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


def _nibble_tiles(
    d: torch.Tensor, m: torch.Tensor | None, values: torch.Tensor, panels: int, fifth: bool = False
) -> torch.Tensor:
    """Tiles of the 32-blocks' formats from per-block scales d, offsets m [N, nb] (float16; None: no m)
    and values [N, nb, 32]: the nibbles, and with ``fifth`` a bit plane of the fifth bits after them."""
    v = _by_panel(values, panels).permute(0, 2, 3, 1)  # [P, nb, 32, 16]
    low = v & 0x0F
    packed_nibbles = low[..., : PANEL // 2] | (low[..., PANEL // 2 :] << 4)  # [P, nb, 32, 8]
    fields = (d,) if m is None else (d, m)
    scales = [_as_bytes(_by_panel(t, panels).transpose(1, 2)) for t in fields]  # [P, nb, 16 x bytes]
    bits = [_bit_rows(v >> 4)] if fifth else []  # [P, nb, 64]
    return torch.cat([*scales, _as_bytes(packed_nibbles), *bits], dim=-1)


def _pack_iq4_xs(weight: QuantizedWeight, panels: int) -> torch.Tensor:
    """IQ4_XS blocks as I4S super-tiles [P, K / 256, 2176] (the module docstring): the float16 D and the
    6-bit sub-scales (gguf's split: 4 low bits from scales_l, 2 high from scales_h) in the header, then
    each block's nibbles as I4's."""
    n = weight.shape[0]
    raw = weight.blocks  # [N, K / 256, 136]: d, scales_h (uint16), scales_l[4], qs[128]
    supers = raw.shape[1]
    scales_h = raw[..., 2:4].contiguous().view(torch.int16).int() & 0xFFFF  # [N, ns, 1]
    high = ((scales_h >> (2 * torch.arange(SUPER))) & 0x03).to(torch.uint8)  # [N, ns, 8]
    low = torch.stack([raw[..., 4:8] & 0x0F, raw[..., 4:8] >> 4], dim=-1).reshape(
        n, supers, SUPER
    )  # [N, ns, 8]
    qs = raw[..., 8:].reshape(n, supers * SUPER, BLOCK // 2)  # [N, nb, 16]
    values = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [N, nb, 32], element order
    v = _by_panel(values, panels).permute(0, 2, 3, 1)  # [P, nb, 32, 16]
    nibbles = _as_bytes(v[..., : PANEL // 2] | (v[..., PANEL // 2 :] << 4))  # [P, nb, 256]
    return _join(_six_bit_head(raw[..., 0:2], low | (high << 4), panels), nibbles, I4S)


def _pack_q3_k(weight: QuantizedWeight, panels: int) -> torch.Tensor:
    """Q3_K blocks as Q3S super-tiles [P, K / 256, 1760] (quantized.h): the float16 D and the 16 6-bit
    sub-block scales (gguf's unpacking of its 12 bytes) in the header, then each block's 3-bit u = q + 4
    as a 2-bit plane and a bit plane."""
    n = weight.shape[0]
    raw = weight.blocks  # [N, K / 256, 110]: hmask[32], qs[64], scales[12], d
    supers = raw.shape[1]
    packed_scales = raw[..., 96:108]
    low = torch.cat([packed_scales[..., :8] & 0x0F, packed_scales[..., :8] >> 4], dim=-1)  # [N, ns, 16]
    high = torch.stack(
        [(packed_scales[..., 8:] >> (2 * t)) & 0x03 for t in range(4)], dim=-2
    )  # [N, ns, 4, 4]
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8).view(1, 1, 1, 4, 1)
    two = (raw[..., 32:96].reshape(n, supers, 2, 1, 32) >> shifts) & 0x03  # [N, ns, 2, 4, 32]: 128h + 32t + l
    bits = torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)
    third = (raw[..., :32].reshape(n, supers, 1, 32) >> bits) & 0x01  # [N, ns, 8, 32]: element 32b + l
    u = two.reshape(n, supers, 256) | (third.reshape(n, supers, 256) << 2)  # [N, ns, 256], 0..7
    v = _by_panel(u.reshape(n, -1, BLOCK), panels).permute(0, 2, 3, 1)  # [P, nb, 32, 16]
    tiles = torch.cat([_two_bit_rows(v & 0x03), _bit_rows(v >> 2)], dim=-1)  # [P, nb, 192]
    scales = low | (high.reshape(n, supers, 16) << 4)  # [N, ns, 16], 0..63
    return _join(_six_bit_head(raw[..., 108:110], scales, panels), tiles, Q3S)


def _pack_q2_k(weight: QuantizedWeight, panels: int) -> torch.Tensor:
    """Q2_K blocks as Q2S super-tiles [P, K / 256, 1344] (quantized.h): the float16 D and Dmin and the 16
    sub-blocks' bytes sc | mn << 4 in the header, then each block's 2-bit quants as a 2-bit plane."""
    n = weight.shape[0]
    raw = weight.blocks  # [N, K / 256, 84]: scales[16], qs[64], d, dmin
    supers = raw.shape[1]
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8).view(1, 1, 1, 4, 1)
    q = (raw[..., 16:80].reshape(n, supers, 2, 1, 32) >> shifts) & 0x03  # [N, ns, 2, 4, 32]: 128h + 32t + l
    v = _by_panel(q.reshape(n, -1, BLOCK), panels).permute(0, 2, 3, 1)  # [P, nb, 32, 16]
    scales = [_as_bytes(_by_panel(_f16(raw[..., at : at + 2]), panels).transpose(1, 2)) for at in (80, 82)]
    subs = _by_panel(raw[..., :16], panels).permute(0, 2, 3, 1).reshape(panels, supers, -1)  # [P, ns, 256]
    return _join(torch.cat([*scales, subs], dim=-1), _two_bit_rows(v), Q2S)


def _q2s_scales(head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each Q2S half block's scale D * sc and min -(Dmin * mn) per row, float32 [..., nb, 2, 16] each, from
    the headers [..., ns, 320]: the kernels' exact products."""
    lead, supers = head.shape[:-2], head.shape[-2]
    d_super = head[..., :SCALE_BYTES].contiguous().view(torch.float16).float()  # [..., ns, 16]
    dmin = head[..., SCALE_BYTES : 2 * SCALE_BYTES].contiguous().view(torch.float16).float()
    subs = head[..., 2 * SCALE_BYTES :].reshape(*lead, supers, 2 * SUPER, PANEL).int()  # [..., ns, 16, 16]
    scale = d_super[..., None, :] * (subs & 0x0F).float()
    mins = -(dmin[..., None, :] * (subs >> 4).float())
    return scale.reshape(*lead, -1, 2, PANEL), mins.reshape(*lead, -1, 2, PANEL)


def _six_bit_head(d_bytes: torch.Tensor, scales: torch.Tensor, panels: int) -> torch.Tensor:
    """An I4S or Q3S super-tile header [P, ns, 32 + G x 12] from each row's float16 D bytes [N, ns, 2]
    and G 6-bit scales [N, ns, G] uint8: D[16], then per scale its 16 rows' low 4 bits (rows j and j + 8
    in byte j) and high 2 bits (row c at bits 2 (c % 4) of byte 8 + c / 4)."""
    d_super = _as_bytes(_by_panel(_f16(d_bytes), panels).transpose(1, 2))  # [P, ns, 32]
    sc = _by_panel(scales, panels).permute(0, 2, 3, 1)  # [P, ns, G, 16]
    low = (sc[..., : PANEL // 2] & 0x0F) | ((sc[..., PANEL // 2 :] & 0x0F) << 4)  # [P, ns, G, 8]
    pairs = (sc >> 4).reshape(*sc.shape[:-1], 4, 4) << (2 * torch.arange(4, dtype=torch.uint8))
    high = pairs.sum(dim=-1, dtype=torch.uint8)  # [P, ns, G, 4]
    return torch.cat([d_super, torch.cat([low, high], dim=-1).reshape(*sc.shape[:2], -1)], dim=-1)


def _six_bit_scales(head: torch.Tensor, per_block: int) -> torch.Tensor:
    """Each block's scales D * (sc - 32) per row, float32 [..., nb, per_block, 16], from I4S (one a block)
    or Q3S (two) headers [..., ns, 32 + 8 x per_block x 12]: the kernels' exact products."""
    lead, supers = head.shape[:-2], head.shape[-2]
    d_super = head[..., :SCALE_BYTES].contiguous().view(torch.float16).float()  # [..., ns, 16]
    six = head[..., SCALE_BYTES:].reshape(*lead, supers, SUPER * per_block, SIX_BIT_BYTES)
    low = torch.cat(
        [six[..., : PANEL // 2] & 0x0F, six[..., : PANEL // 2] >> 4], dim=-1
    ).int()  # [..., G, 16]
    pairs = six[..., PANEL // 2 :].unsqueeze(-1) >> (2 * torch.arange(4, dtype=torch.uint8))  # [..., G, 4, 4]
    high = (pairs & 0x03).reshape(*lead, supers, SUPER * per_block, PANEL).int()
    scale = d_super[..., None, :] * ((low | (high << 4)) - 32).float()  # [..., ns, G, 16]
    return scale.reshape(*lead, supers * SUPER, per_block, PANEL)


def _pack_q4_k(weight: QuantizedWeight, panels: int) -> torch.Tensor:
    """Q4_K blocks as Q4S super-tiles [P, K / 256, 2304] (the module docstring): the float16 d and dmin,
    the 6-bit sub-scales and sub-mins split in low and high bits (gguf's own unpacking), the nibbles."""
    return _pack_k4_head(weight, panels, _k4_nibbles(weight.blocks[..., 16:]), Q4S)


def _pack_q5_k(weight: QuantizedWeight, panels: int) -> torch.Tensor:
    """Q5_K blocks as Q5S super-tiles [P, K / 256, 2816]: Q4S's, with each value's fifth bit (gguf's
    layout: bit s of the 32 qh bytes belongs to sub-block s) in a bit plane after the block's nibbles."""
    raw = weight.blocks  # [N, K / 256, 176]: d, dmin, 12 bytes of scales, qh[32], qs[128]
    qh = raw[..., 16:48].unsqueeze(2)  # [N, ns, 1, 32]
    fifth = (qh >> torch.arange(SUPER, dtype=torch.uint8).view(1, 1, SUPER, 1)) & 0x01  # [N, ns, 8, 32]
    values = _k4_nibbles(raw[..., 48:]) | (fifth.reshape(weight.shape[0], -1, BLOCK) << 4)
    return _pack_k4_head(weight, panels, values, Q5S)


def _k4_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K quant bytes [N, ns, 128] -> their 4-bit values [N, nb, 32] (4 chunks of 32 bytes:
    sub-block 2i in chunk i's low nibbles, 2i + 1 in its high ones)."""
    n, supers = qs.shape[:2]
    chunks = qs.reshape(n, supers, 4, 1, 32)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=3).reshape(n, supers * SUPER, BLOCK)


def _pack_k4_head(weight: QuantizedWeight, panels: int, values: torch.Tensor, fmt: int) -> torch.Tensor:
    """Super-tiles of ``fmt`` (Q4S, Q5S) from K-type blocks that open with Q4_K's d, dmin and 12 bytes of
    6-bit scales, and their values [N, nb, 32] (0..15; Q5S 0..31, the fifth bit in a bit plane)."""
    n = weight.shape[0]
    raw = weight.blocks  # [N, K / 256, block bytes]
    supers = raw.shape[1]
    sc, mn = gguf.quants.Q4_K.get_scale_min(raw[..., 4:16].reshape(-1, 12).numpy())  # [N * ns, 8] each
    sc_t = torch.from_numpy(sc.astype(np.uint8)).view(n, supers, SUPER)
    mn_t = torch.from_numpy(mn.astype(np.uint8)).view(n, supers, SUPER)
    low = ((sc_t & 0x0F) | ((mn_t & 0x0F) << 4)).reshape(n, supers * SUPER)  # [N, nb]
    high = (sc_t >> 4) | ((mn_t >> 4) << 2)  # [N, ns, 8], 0..15
    v = _by_panel(values, panels).permute(0, 2, 3, 1)  # [P, nb, 32, 16]
    nibbles = (v[..., : PANEL // 2] & 0x0F) | ((v[..., PANEL // 2 :] & 0x0F) << 4)  # [P, nb, 32, 8]
    parts = [_by_panel(low, panels).transpose(1, 2), _as_bytes(nibbles)]  # [P, nb, 16], [P, nb, 256]
    if fmt == Q5S:
        parts.append(_bit_rows(v >> 4))  # [P, nb, 64]
    tiles = torch.cat(parts, dim=-1)  # [P, nb, tile bytes]
    scales = [_as_bytes(_by_panel(_f16(raw[..., at : at + 2]), panels).transpose(1, 2)) for at in (0, 2)]
    h = _by_panel(high, panels).permute(0, 2, 3, 1)  # [P, ns, 8, 16]
    high_nibbles = (h[..., : PANEL // 2] | (h[..., PANEL // 2 :] << 4)).reshape(
        panels, supers, -1
    )  # [P, ns, 64]
    return _join(torch.cat([*scales, high_nibbles], dim=-1), tiles, fmt)


def _bit_rows(bits: torch.Tensor) -> torch.Tensor:
    """[..., 32, 16] values 0..1 -> [..., 64] bytes: row k's 2 bytes hold column c at bit c."""
    by = bits.reshape(*bits.shape[:-1], 2, 8) << torch.arange(8, dtype=torch.uint8)  # [..., 32, 2, 8]
    return by.sum(dim=-1, dtype=torch.uint8).reshape(*bits.shape[:-2], -1)


def _bit_values(plane: torch.Tensor) -> torch.Tensor:
    """The inverse of _bit_rows: [..., 64] bytes -> [..., 32, 16] values 0..1."""
    by = plane.reshape(*plane.shape[:-1], BLOCK, 2, 1)
    return ((by >> torch.arange(8, dtype=torch.uint8)) & 0x01).reshape(*plane.shape[:-1], BLOCK, PANEL)


def _join(head: torch.Tensor, tiles: torch.Tensor, fmt: int) -> torch.Tensor:
    """Super-tiles of ``fmt`` (Q4S, Q8S) from their headers [..., ns, HEAD] and block tiles [..., nb, tile
    bytes]: [..., ns, super bytes]."""
    assert head.shape[-1] == HEAD[fmt] and tiles.shape[-1] == TILE_BYTES[fmt]
    return torch.cat([head, tiles.reshape(*head.shape[:-1], -1)], dim=-1)


def _split(packed: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Super-tiles of ``fmt`` [..., ns, super bytes] -> (headers [..., ns, HEAD], block tiles [..., nb, tile
    bytes])."""
    head, body = packed[..., : HEAD[fmt]], packed[..., HEAD[fmt] :]
    return head, body.reshape(*packed.shape[:-2], -1, TILE_BYTES[fmt])


def _q8s_scales(head: torch.Tensor) -> torch.Tensor:
    """Each Q8S half block's scale D * sc per row, float32 [..., nb, 2, 16], from the headers [..., ns,
    288]: the kernels' exact products."""
    d_super = head[..., :SCALE_BYTES].contiguous().view(torch.float16).float()  # [..., ns, 16]
    subs = head[..., SCALE_BYTES:].contiguous().view(torch.int8).float()  # [..., ns, 256]
    subs = subs.reshape(*head.shape[:-1], 2 * SUPER, PANEL)  # [..., ns, 16 sub-blocks, 16 rows]
    scale = d_super[..., None, :] * subs
    return scale.reshape(*head.shape[:-2], -1, 2, PANEL)


def _q4s_scales(head: torch.Tensor, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each Q4S block's d = d_super * sc and m = -(dmin * mn) per row, float32 [..., nb, 16] each, from the
    headers [..., ns, 128] and the blocks' low bytes [..., nb, 16]: the kernels' exact products."""
    lead, supers = head.shape[:-2], head.shape[-2]
    d_super = head[..., :SCALE_BYTES].contiguous().view(torch.float16).float()  # [..., ns, 16]
    dmin = head[..., SCALE_BYTES : 2 * SCALE_BYTES].contiguous().view(torch.float16).float()
    packed_high = head[..., 2 * SCALE_BYTES :].reshape(*lead, supers, SUPER, PANEL // 2)
    high = torch.cat([packed_high & 0x0F, packed_high >> 4], dim=-1).int()  # [..., ns, 8, 16]
    low = low.reshape(*lead, supers, SUPER, PANEL).int()
    sc = (low & 0x0F) | ((high & 0x03) << 4)
    mn = (low >> 4) | ((high >> 2) << 4)
    d = d_super[..., None, :] * sc.float()
    m = -(dmin[..., None, :] * mn.float())
    return d.reshape(*lead, -1, PANEL), m.reshape(*lead, -1, PANEL)


def _pack_q6_k(weight: QuantizedWeight, panels: int) -> torch.Tensor:
    """Q6_K blocks as Q8S super-tiles [P, K / 256, 3360] (the module docstring): the float16 D, the int8
    sub-scales, the 6-bit quants u = q + 32 (gguf's own unpacking) in a 4-bit and a 2-bit plane."""
    n, k = weight.shape
    raw = weight.blocks  # [N, K / 256, 210]
    supers = raw.shape[1]
    ql = raw[..., :128].reshape(n, supers, 2, 1, 64)
    ql = torch.cat([ql & 0x0F, ql >> 4], dim=3).reshape(n, supers, 8, 32)
    qh = raw[..., 128:192].reshape(n, supers, 2, 1, 32)
    qh = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=3).reshape(n, supers, 8, 32)
    u = _by_panel((ql | (qh << 4)).reshape(n, k // BLOCK, BLOCK), panels).permute(
        0, 2, 3, 1
    )  # [P, nb, 32, 16]
    low = u & 0x0F
    nibbles = low[..., : PANEL // 2] | (low[..., PANEL // 2 :] << 4)  # [P, nb, 32, 8]
    tiles = torch.cat([_as_bytes(nibbles), _two_bit_rows(u >> 4)], dim=-1)  # [P, nb, 384]
    d_super = _as_bytes(_by_panel(_f16(raw[..., 208:210]), panels).transpose(1, 2))  # [P, ns, 32]
    subs = (
        _by_panel(raw[..., 192:208], panels).permute(0, 2, 3, 1).reshape(panels, supers, -1)
    )  # [P, ns, 256]
    return _join(torch.cat([d_super, subs], dim=-1), tiles, Q8S)


def _two_bit_rows(high: torch.Tensor) -> torch.Tensor:
    """[..., 32, 16] values 0..3 -> [..., 128] bytes: row k's 4 bytes hold column c at bits 2c."""
    shifts = 2 * torch.arange(PANEL // 4, dtype=torch.uint8)  # within a byte: columns 4i .. 4i + 3
    by = high.reshape(*high.shape[:-1], 4, PANEL // 4) << shifts  # [..., 32, 4, 4]
    return (by[..., 0] | by[..., 1] | by[..., 2] | by[..., 3]).reshape(*high.shape[:-2], -1)


def _two_bit_values(plane: torch.Tensor) -> torch.Tensor:
    """The inverse of _two_bit_rows: [..., 128] bytes -> [..., 32, 16] values 0..3."""
    by = plane.reshape(*plane.shape[:-1], BLOCK, 4, 1)
    shifts = 2 * torch.arange(PANEL // 4, dtype=torch.uint8)
    return ((by >> shifts) & 0x03).reshape(*plane.shape[:-1], BLOCK, PANEL)


def _header_bytes(fmt: int) -> int:
    """Bytes of a block tile's scales, before its quants (Q4S, Q5S: the sub-scales' low bits)."""
    return HEADER_BYTES[fmt]


def to_dot_layout(packed: torch.Tensor, fmt: int) -> torch.Tensor:
    """A packed weight of ``fmt`` with its quants regrouped for integer activations (format fmt + DOT or
    + WIDE; see the module docstring): every block tile's quants, headers unchanged."""
    if GROUP[fmt] > 1:
        head, tiles = _split(packed, fmt)
        return _join(head, _tiles_to_dot_layout(tiles, fmt), fmt)
    return _tiles_to_dot_layout(packed, fmt)


def _tiles_to_dot_layout(tiles: torch.Tensor, fmt: int) -> torch.Tensor:
    """Block tiles [..., tile bytes] of ``fmt`` in the dot layout: each plane of quants regrouped."""
    return _by_planes(tiles, fmt, _TO_DOT)


def _from_dot_layout(tiles: torch.Tensor, fmt: int) -> torch.Tensor:
    """The inverse of to_dot_layout on block tiles: tiles of fmt + DOT (or + WIDE) -> tiles of fmt."""
    return _by_planes(tiles, fmt, _FROM_DOT)


def _planes(tiles: torch.Tensor, fmt: int) -> list[tuple[str, torch.Tensor]]:
    """A block tile's quant planes (PLANES[fmt]), each (kind, bytes [..., plane bytes])."""
    planes, at = [], HEADER_BYTES[fmt]
    for kind in PLANES[fmt]:
        size = BLOCK * PANEL * PLANE_BITS[kind] // 8
        planes.append((kind, tiles[..., at : at + size]))
        at += size
    return planes


def _by_planes(
    tiles: torch.Tensor, fmt: int, convert: dict[str, Callable[[torch.Tensor], torch.Tensor]]
) -> torch.Tensor:
    """Block tiles with each plane of their quants passed through ``convert[kind]``, headers unchanged."""
    parts = [convert[kind](plane) for kind, plane in _planes(tiles, fmt)]
    return torch.cat([tiles[..., : HEADER_BYTES[fmt]], *parts], dim=-1)


def _plane_values(tiles: torch.Tensor, fmt: int) -> torch.Tensor:
    """The unsigned quants u of block tiles [..., tile bytes] of ``fmt`` (plain layout), [..., 32, 16]
    int32: each plane's values above the bits of the planes before it (Q8: the int8 values themselves)."""
    u, shift = None, 0
    for kind, plane in _planes(tiles, fmt):
        values = _VALUES[kind](plane).int() << shift  # [..., 32, 16]
        u, shift = values if u is None else u | values, shift + PLANE_BITS[kind]
    assert u is not None
    return u


def _int8_values(body: torch.Tensor) -> torch.Tensor:
    """Q8's int8 quants [..., 512] as [..., 32, 16]."""
    return body.contiguous().view(torch.int8).reshape(*body.shape[:-1], BLOCK, PANEL)


def _nibble_values(body: torch.Tensor) -> torch.Tensor:
    """Nibbles [..., 256] (byte j of a row: column j low, column j + 8 high) as [..., 32, 16]."""
    by = body.reshape(*body.shape[:-1], BLOCK, PANEL // 2)
    return torch.cat([by & 0x0F, by >> 4], dim=-1)


def _int8_to_dot(body: torch.Tensor) -> torch.Tensor:
    """Q8's int8 quants [..., 512] ([32 k][16 columns]) as quads of 4 k per column, each byte q ^ 0x80."""
    quads = body.reshape(*body.shape[:-1], QUADS, 4, PANEL).transpose(-1, -2)  # [..., 8, 16, 4]
    return (quads ^ 0x80).reshape(*body.shape[:-1], -1)


def _int8_from_dot(body: torch.Tensor) -> torch.Tensor:
    """The inverse of _int8_to_dot."""
    quads = (body ^ 0x80).reshape(*body.shape[:-1], QUADS, PANEL, 4)
    return quads.transpose(-1, -2).reshape(*body.shape[:-1], -1)


def _two_bits_to_dot(plane: torch.Tensor) -> torch.Tensor:
    """A 2-bit plane [..., 128] (_two_bit_rows) as 2 chunks x 16 columns x 4 bytes, quad 4h + t's values
    at bits 2t of chunk h."""
    lead = plane.shape[:-1]
    values = _two_bit_values(plane).reshape(*lead, 2, 4, 4, PANEL)  # [..., h, t, i, c]
    by_quad = values.movedim(-1, -3).transpose(-1, -2)  # [..., h, c, i, t]
    chunks = (by_quad << (2 * torch.arange(4, dtype=torch.uint8))).sum(dim=-1, dtype=torch.uint8)
    return chunks.reshape(*lead, -1)


def _two_bits_from_dot(plane: torch.Tensor) -> torch.Tensor:
    """The inverse of _two_bits_to_dot."""
    lead = plane.shape[:-1]
    chunks = plane.reshape(*lead, 2, PANEL, 4, 1)  # [..., h, c, i, 1]
    by_quad = (chunks >> (2 * torch.arange(4, dtype=torch.uint8))) & 0x03  # [..., h, c, i, t]
    return _two_bit_rows(by_quad.transpose(-1, -2).movedim(-3, -1).reshape(*lead, BLOCK, PANEL))


def _bits_to_dot(plane: torch.Tensor) -> torch.Tensor:
    """A bit plane [..., 64] (_bit_rows) by column and quad input (16 x 4 bytes), quad j's bit at bit j."""
    lead = plane.shape[:-1]
    bits = _bit_values(plane).reshape(*lead, QUADS, 4, PANEL)  # [..., j, i, c]
    by_input = bits.permute(*range(len(lead)), -1, -2, -3) << torch.arange(QUADS, dtype=torch.uint8)
    return by_input.sum(dim=-1, dtype=torch.uint8).reshape(*lead, -1)  # [..., 16 x 4]


def _bits_from_dot(plane: torch.Tensor) -> torch.Tensor:
    """The inverse of _bits_to_dot."""
    lead = plane.shape[:-1]
    by_input = plane.reshape(*lead, PANEL, 4, 1)  # [..., c, i, 1]
    bits = (by_input >> torch.arange(QUADS, dtype=torch.uint8)) & 0x01  # [..., c, i, j]
    return _bit_rows(bits.permute(*range(len(lead)), -1, -2, -3).reshape(*lead, BLOCK, PANEL))


def _nibbles_to_dot(body: torch.Tensor) -> torch.Tensor:
    """Q4-style nibbles [..., 256] ([32 k][8 bytes]) in the dot layout (4 chunks x 16 columns x 4 bytes)."""
    lead = body.shape[:-1]
    by = body.reshape(*lead, BLOCK, PANEL // 2)
    values = torch.cat([by & 0x0F, by >> 4], dim=-1)  # [..., 32, 16]
    quads = values.reshape(*lead, QUADS, 4, PANEL).transpose(-1, -2)  # [..., 8, 16, 4]
    nibbles = quads[..., : QUADS // 2, :, :] | (quads[..., QUADS // 2 :, :, :] << 4)  # [..., 4, 16, 4]
    return nibbles.reshape(*lead, -1)


def _nibbles_from_dot(body: torch.Tensor) -> torch.Tensor:
    """The inverse of _nibbles_to_dot."""
    lead = body.shape[:-1]
    chunks = body.reshape(*lead, QUADS // 2, PANEL, 4)
    quads = torch.cat([chunks & 0x0F, chunks >> 4], dim=-3)  # [..., 8, 16, 4]
    values = quads.transpose(-1, -2).reshape(*lead, BLOCK, PANEL)  # [..., 32, 16]
    return (values[..., : PANEL // 2] | (values[..., PANEL // 2 :] << 4)).reshape(*lead, -1)


_TO_DOT = {"int8": _int8_to_dot, "nibble": _nibbles_to_dot, "two": _two_bits_to_dot, "bit": _bits_to_dot}
_FROM_DOT = {
    "int8": _int8_from_dot,
    "nibble": _nibbles_from_dot,
    "two": _two_bits_from_dot,
    "bit": _bits_from_dot,
}
_VALUES = {"int8": _int8_values, "nibble": _nibble_values, "two": _two_bit_values, "bit": _bit_values}


def pack_quantized(
    weight: QuantizedWeight, activations: str = "float", order: torch.Tensor | None = None
) -> tuple[int, torch.Tensor]:
    """(format, packed [P, K / 32, tile bytes] uint8) of a quantized [N, K] weight for its inputs'
    ``activations`` ("float"; "int8" or "int16": the dot layout, format + DOT or + WIDE). With ``order``
    [N'] long, packed row r is the weight's row order[r]: ``weight.take_rows(order)`` packed, its blocks
    not copied. One C++ pass (csrc/repack.h) when the compiled kernels are loaded, the bytes of
    ``pack_quantized_reference`` (the torch packer, used where they are not)."""
    return pack_stacked([weight], activations, order)


def pack_stacked(
    parts: Sequence[QuantizedWeight], activations: str = "float", order: torch.Tensor | None = None
) -> tuple[int, torch.Tensor]:
    """``pack_quantized`` of the parts' rows one after another (``QuantizedWeight.stack(parts)``: a fused
    q|k|v or gate|up), their blocks read where they are (a file's mapping), never stacked in memory."""
    if not parts or any(p.qtype != parts[0].qtype or p.shape[1] != parts[0].shape[1] for p in parts):
        raise ValueError("only weights of one quantized type and input width stack")
    module = kernels.backend().module
    if module is None:
        whole = parts[0] if len(parts) == 1 else QuantizedWeight.stack(list(parts))
        return pack_quantized_reference(whole, activations, order)
    fmt = FORMAT_OF[parts[0].qtype] + ACTIVATION_OFFSET[activations]
    rows = None if order is None else order.long()
    n = sum(p.shape[0] for p in parts) if rows is None else int(rows.numel())
    return fmt, module.repack_quantized([p.blocks for p in parts], n, parts[0].shape[1], fmt, rows)


def pack_quantized_reference(
    weight: QuantizedWeight, activations: str = "float", order: torch.Tensor | None = None
) -> tuple[int, torch.Tensor]:
    """``pack_quantized`` in torch, pass by pass: the portable packer and the compiled one's reference."""
    if order is not None:
        weight = weight.take_rows(order)
    fmt, packed = _pack(weight)
    offset = ACTIVATION_OFFSET[activations]
    return (fmt + offset, to_dot_layout(packed, fmt).contiguous()) if offset else (fmt, packed)


SUPER_PACKERS = {
    "Q4_K": _pack_q4_k,
    "Q6_K": _pack_q6_k,
    "Q5_K": _pack_q5_k,
    "IQ4_XS": _pack_iq4_xs,
    "Q3_K": _pack_q3_k,
    "Q2_K": _pack_q2_k,
}  # packers of the super-tile formats, by GGUF type


def _pack(weight: QuantizedWeight) -> tuple[int, torch.Tensor]:
    n, k = weight.shape
    panels, blocks = -(-n // PANEL), k // BLOCK
    if weight.qtype in SUPER_PACKERS:  # the types of 256-element blocks
        return FORMAT_OF[weight.qtype], SUPER_PACKERS[weight.qtype](weight, panels)
    raw = weight.blocks  # [N, nb, block bytes]
    d = _by_panel(_f16(raw[..., 0:2]), panels).transpose(1, 2)  # [P, nb, 16]
    if weight.qtype == "Q8_0":
        q = _by_panel(raw[..., 2:].contiguous().view(torch.int8), panels)  # [P, 16, nb, 32]
        quants = q.permute(0, 2, 3, 1)  # [P, nb, 32, 16]
        return Q8, torch.cat([_as_bytes(d), _as_bytes(quants)], dim=-1)
    nibbles = raw[..., -BLOCK // 2 :]  # [N, nb, 16]
    values = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # [N, nb, 32], element order
    assert values.shape[1] == blocks
    d16 = _f16(raw[..., 0:2])  # [N, nb] float16
    if weight.qtype in ("Q5_0", "Q5_1"):  # the fifth bits: bit j of a little-endian uint32 is element j's
        at = 2 if weight.qtype == "Q5_0" else 4
        # a fresh copy: one row of one block is already "contiguous" at offset 2, which no int32 view takes
        fifth = raw[..., at : at + 4].clone(memory_format=torch.contiguous_format)  # [N, nb, 4]
        qh = fifth.view(torch.int32).long() & 0xFFFFFFFF  # [N, nb, 1]
        values = values | (((qh >> torch.arange(BLOCK)) & 0x01).to(torch.uint8) << 4)
        m16 = None if weight.qtype == "Q5_0" else _f16(raw[..., 2:4])
        return FORMAT_OF[weight.qtype], _nibble_tiles(d16, m16, values, panels, fifth=True)
    if weight.qtype == "Q4_1":
        return Q4, _nibble_tiles(d16, _f16(raw[..., 2:4]), values, panels)
    return FORMAT_OF[weight.qtype], _nibble_tiles(d16, None, values, panels)  # Q4_0, IQ4_NL: d alone


OFFSET = {
    Q8S: 32,
    Q3S: 4,
    Q5Z: 16,
    Q4Z: 8,
}  # what a format's unsigned quant u exceeds its signed q by (q = u - offset)


def _tile_parts(packed: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """packed [..., entries, super bytes] -> scale [..., nb, 32, 16] (each k's), m [..., nb, 1, 16]
    (Q2S: [..., nb, 32, 16], each k's) or None, quants [..., nb, 32, 16], all float32."""
    dot, fmt = fmt >= DOT, fmt % DOT
    tiles, head = packed, None
    if GROUP[fmt] > 1:
        head, tiles = _split(packed, fmt)
    if dot:
        tiles = _from_dot_layout(tiles, fmt)
    scale, m = _block_scales(tiles, head, fmt)  # [..., nb, 2, 16] (each half block's), [..., nb, 1 or 2, 16]
    u = _plane_values(tiles, fmt)  # [..., nb, 32, 16]
    q = IQ4_VALUES[u.long()] if fmt in (I4, I4S) else (u - OFFSET.get(fmt, 0)).float()
    if m is not None and m.shape[-2] == 2:  # Q2S: a min per half block
        m = m.repeat_interleave(BLOCK // 2, dim=-2)
    return scale.repeat_interleave(BLOCK // 2, dim=-2), m, q


def _block_scales(
    tiles: torch.Tensor, head: torch.Tensor | None, fmt: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each block's scale per half block [..., nb, 2, 16] and min [..., nb, 1, 16] (Q2S: per half block,
    [..., nb, 2, 16]; None: no min) as the kernels form them, from the block tiles and, for the K types,
    the super-tiles' headers."""
    if head is None:  # Q8, I4: d; Q4: d then m, float16 in the tile
        fields = (
            tiles[..., : HEADER_BYTES[fmt]].contiguous().view(torch.float16).float()
        )  # [..., nb, 16 or 32]
        d = fields[..., :PANEL].unsqueeze(-2).expand(*fields.shape[:-1], 2, PANEL)
        return d, fields[..., PANEL:].unsqueeze(-2) if fmt in (Q4, Q5) else None
    if fmt in (Q4S, Q5S):
        d16, m16 = _q4s_scales(head, tiles[..., :PANEL])  # [..., nb, 16] each
        return d16.unsqueeze(-2).expand(*d16.shape[:-1], 2, PANEL), m16.unsqueeze(-2)
    if fmt == Q8S:
        return _q8s_scales(head), None
    if fmt == Q2S:
        return _q2s_scales(head)
    halves = _six_bit_scales(head, 2 if fmt == Q3S else 1)  # [..., nb, 2 or 1, 16]
    return halves.expand(*halves.shape[:-2], 2, PANEL), None


def _values(scale: torch.Tensor, m: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """q * d (+ m) per column, as the kernels compute it (fma: q * d is exact): [..., nb, 32, 16] float32."""
    w = q * scale
    return w if m is None else w + m


def unpack_quantized(packed: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
    """The [N, K] float32 weight the kernels multiply by (gguf's dequantized values)."""
    w = _values(*_tile_parts(packed, fmt))  # [P, nb, 32, 16]
    panels, blocks = w.shape[:2]
    return w.permute(0, 3, 1, 2).reshape(panels * PANEL, blocks * BLOCK)[:n].contiguous()


def quantized_rows(packed: torch.Tensor, fmt: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` [T] long of the weight, dequantized: [T, K] float32 (an embedding lookup)."""
    if ids.numel() == 0:  # (the layout's reshapes cannot infer a width from no rows)
        return torch.empty(0, packed.shape[1] * GROUP[fmt % DOT] * BLOCK)
    scale, m, q = _tile_parts(packed[ids // PANEL], fmt)  # [T, nb, 32, 16], [T, nb, 1, 16], [T, nb, 32, 16]
    col = (ids % PANEL).view(-1, 1, 1, 1)
    scale = scale.gather(3, col.expand(-1, scale.shape[1], BLOCK, 1))  # [T, nb, 32, 1]
    m = None if m is None else m.gather(3, col.expand(-1, m.shape[1], m.shape[2], 1))
    q = q.gather(3, col.expand(-1, q.shape[1], BLOCK, 1))  # [T, nb, 32, 1]
    return _values(scale, m, q).reshape(ids.numel(), -1)
