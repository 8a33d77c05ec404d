"""The GGUF block types the engine keeps quantized (bytes and elements per block; engine/quantized.py
describes each) and the sizes of the packed layout the kernels read them in (formats, tiles, headers;
engine/kernels/quant_pack.py packs it, engine/kernels/csrc/quantized.h reads it). Torch-free, so planning
and listing models size weights without loading torch."""

from __future__ import annotations

BLOCK = 32  # elements per block of the 32-element types; every kept type's K is a multiple of it
BLOCK_BYTES = {
    "Q8_0": 34,
    "Q4_0": 18,
    "Q4_1": 20,
    "Q4_K": 144,
    "Q6_K": 210,
    "Q5_K": 176,
    "IQ4_NL": 18,
    "IQ4_XS": 136,
    "Q3_K": 110,
    "Q2_K": 84,
    "Q5_0": 22,
    "Q5_1": 24,
}
BLOCK_ELEMENTS = {
    "Q8_0": 32,
    "Q4_0": 32,
    "Q4_1": 32,
    "Q4_K": 256,
    "Q6_K": 256,
    "Q5_K": 256,
    "IQ4_NL": 32,
    "IQ4_XS": 256,
    "Q3_K": 256,
    "Q2_K": 256,
    "Q5_0": 32,
    "Q5_1": 32,
}
QTYPES = tuple(BLOCK_BYTES)
PANEL = 16
Q8, Q4, Q4S, Q8S, Q5S, I4, I4S, Q3S, Q2S, Q5, Q5Z, Q4Z = range(12)  # quantized.h QFormat
DOT = 12  # qdot.h: format + DOT is the format in the dot layout (int8 activations); the base formats' count
WIDE = 2 * DOT  # qdot.h: format + WIDE is the dot layout with int16 activations
FORMAT_OF = {
    "Q8_0": Q8,
    "Q4_0": Q4Z,
    "Q4_1": Q4,
    "Q4_K": Q4S,
    "Q6_K": Q8S,
    "Q5_K": Q5S,
    "IQ4_NL": I4,
    "IQ4_XS": I4S,
    "Q3_K": Q3S,
    "Q2_K": Q2S,
    "Q5_1": Q5,
    "Q5_0": Q5Z,
}
SCALE_BYTES = PANEL * 2  # 16 float16 scales (or mins)
WIDE_SCALE_BYTES = PANEL * 4  # 16 float32 scales (or mins)
SUPER = 8  # Q4S: blocks of 32 per super-block (Q4_K's 256 k)
Q4S_HEAD = 2 * SCALE_BYTES + SUPER * PANEL // 2  # d, dmin float16 [16] each; the scales' high bits
TILE_BYTES = {  # per block of 32 k (Q4S: after its super-tile's header)
    Q8: SCALE_BYTES + BLOCK * PANEL,
    Q4: 2 * SCALE_BYTES + BLOCK * PANEL // 2,
    Q4S: PANEL + BLOCK * PANEL // 2,
    Q8S: BLOCK * PANEL // 2 + BLOCK * PANEL // 4,  # the quants' low and high planes
    Q5S: PANEL + BLOCK * PANEL // 2 + BLOCK * PANEL // 8,  # Q4S's, then the bit plane
    I4: SCALE_BYTES + BLOCK * PANEL // 2,
    I4S: BLOCK * PANEL // 2,  # the nibbles alone (the sub-scales are in the header)
    Q3S: BLOCK * PANEL // 4 + BLOCK * PANEL // 8,  # a 2-bit plane, a bit plane
    Q2S: BLOCK * PANEL // 4,  # a 2-bit plane
    Q5: 2 * SCALE_BYTES + BLOCK * PANEL // 2 + BLOCK * PANEL // 8,  # d, m, nibbles, bit plane
    Q5Z: SCALE_BYTES + BLOCK * PANEL // 2 + BLOCK * PANEL // 8,  # d, nibbles, bit plane
    Q4Z: SCALE_BYTES + BLOCK * PANEL // 2,  # d, nibbles
}
Q8S_HEAD = SCALE_BYTES + 2 * SUPER * PANEL  # D float16 [16]; int8 sub-scales [16][16]
GROUP = {
    Q8: 1,
    Q4: 1,
    Q4S: SUPER,
    Q8S: SUPER,
    Q5S: SUPER,
    I4: 1,
    I4S: SUPER,
    Q3S: SUPER,
    Q2S: SUPER,
    Q5: 1,
    Q5Z: 1,
    Q4Z: 1,
}  # blocks per (super-)tile of the packed tensor's last dimension
SIX_BIT_BYTES = PANEL // 2 + PANEL // 4  # 16 rows' 6-bit scales (I4S, Q3S): 4 + 2 bits
HEAD = {
    Q8: 0,
    Q4: 0,
    Q4S: Q4S_HEAD,
    Q8S: Q8S_HEAD,
    Q5S: Q4S_HEAD,
    I4: 0,
    I4S: SCALE_BYTES + SUPER * SIX_BIT_BYTES,  # D float16 [16]; per block 12 bytes of sub-scales
    Q3S: SCALE_BYTES + 2 * SUPER * SIX_BIT_BYTES,  # D float16 [16]; per sub-block of 16 k 12 bytes of scales
    Q2S: 2 * SCALE_BYTES + 2 * SUPER * PANEL,  # D, Dmin float16 [16]; per sub-block sc | mn << 4 [16]
    Q5: 0,
    Q5Z: 0,
    Q4Z: 0,
}  # a super-tile's header before its block tiles


def super_bytes(fmt: int) -> int:
    """Bytes of one entry of a packed tensor's last dimension: a (super-)tile of GROUP[fmt] blocks."""
    base = fmt % DOT
    return HEAD[base] + GROUP[base] * TILE_BYTES[base]


def packed_bytes(qtype: str, n: int, k: int) -> int:
    """Bytes a quantized [N, K] weight of ``qtype`` occupies packed."""
    fmt = FORMAT_OF[qtype]
    return -(-n // PANEL) * (k // (BLOCK * GROUP[fmt])) * super_bytes(fmt)
