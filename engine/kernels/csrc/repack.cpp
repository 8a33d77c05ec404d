// GGUF blocks -> packed tiles (repack.h): per panel and (super-)block, each of the 16 rows' GGUF bytes decoded
// into one record (RowGroup: its unsigned quants u in element order, its float16 scale bytes, its sub-scales),
// then the super-tile's header, each block tile's scale bytes and its quant planes written from the records.
// The plane writers assign every byte they own, so the output needs no zeroing.
#include "repack.h"

#include <cstring>
#include <type_traits>

#include "qdot.h"

namespace nxk {
namespace {

// One row's group of blocks (one block of 32 k; a super-block of 256 for the K types), decoded
struct RowGroup {
  uint8_t u[kSuperBlocks][kQBlock];  // block j's unsigned quants in element order (Q8: the int8 bytes)
  uint8_t f16[2][2];                 // float16 bytes: [0] the scale d (D), [1] the min m (Q4, Q5) or Dmin
  uint8_t sub[2 * kSuperBlocks];     // sub-scales: 6-bit per block (Q4S, Q5S, I4S) or per 16 k (Q3S); Q8S's
                                     // int8 per 16 k; Q2S's byte sc | mn << 4 per 16 k
  uint8_t sub_min[kSuperBlocks];     // Q4S, Q5S: the 6-bit sub-mins
};

void copy_f16(uint8_t* dst, const uint8_t* src) {
  dst[0] = src[0];
  dst[1] = src[1];
}

// 16 bytes of nibbles -> 32 values: byte l holds element l in its low nibble, element l + 16 in its high one
void split_nibbles(const uint8_t* qs, uint8_t* u) {
  for (int l = 0; l < kQBlock / 2; ++l) {
    u[l] = qs[l] & 0x0F;
    u[l + kQBlock / 2] = qs[l] >> 4;
  }
}

// Q8_0: d, 32 int8
void decode_q8_0(const uint8_t* raw, RowGroup& g) {
  copy_f16(g.f16[0], raw);
  std::memcpy(g.u[0], raw + 2, kQBlock);
}

// Q4_0, IQ4_NL: d, nibbles; Q4_1 (``min``): d, m, nibbles
void decode_q4(const uint8_t* raw, RowGroup& g, bool min) {
  copy_f16(g.f16[0], raw);
  if (min) copy_f16(g.f16[1], raw + 2);
  split_nibbles(raw + (min ? 4 : 2), g.u[0]);
}

// A byte's 8 bits spread to 8 bytes as fifth bits: kFifthBits[v][i] = bit i of v, << 4
struct FifthBits {
  uint8_t of[256][8];
  constexpr FifthBits() : of() {
    for (int v = 0; v < 256; ++v)
      for (int i = 0; i < 8; ++i) of[v][i] = static_cast<uint8_t>(((v >> i) & 0x01) << 4);
  }
};
constexpr FifthBits kFifthBits;

// Q5_0: d, qh, nibbles; Q5_1 (``min``): d, m, qh, nibbles. Bit e % 8 of qh[e / 8] (a little-endian uint32) is
// element e's fifth bit
void decode_q5(const uint8_t* raw, RowGroup& g, bool min) {
  const uint8_t* qh = raw + (min ? 4 : 2);
  copy_f16(g.f16[0], raw);
  if (min) copy_f16(g.f16[1], raw + 2);
  split_nibbles(qh + 4, g.u[0]);
  for (int b = 0; b < kQBlock / 8; ++b) {  // 8 elements a byte of qh: one row of the table, ORed as a word
    uint64_t values, fifth;
    std::memcpy(&values, g.u[0] + 8 * b, 8);
    std::memcpy(&fifth, kFifthBits.of[qh[b]], 8);
    values |= fifth;
    std::memcpy(g.u[0] + 8 * b, &values, 8);
  }
}

// Q4_K's 12 bytes of 6-bit sub-scales and sub-mins (gguf's get_scale_min): blocks 0..3 in the low 6 bits of
// bytes 0..3 (scales) and 4..7 (mins); blocks 4..7 in bytes 8..11's nibbles and the high 2 bits of 0..7
void decode_k4_scales(const uint8_t* s, RowGroup& g) {
  for (int j = 0; j < 4; ++j) {
    g.sub[j] = s[j] & 0x3F;
    g.sub_min[j] = s[j + 4] & 0x3F;
    g.sub[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 6) << 4);
    g.sub_min[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Q4_K: d, dmin, scales, qs[128]; Q5_K (``fifth``): d, dmin, scales, qh[32], qs[128]. Block j's nibbles are
// chunk j / 2's (32 bytes) low (j even) or high ones; its element l's fifth bit is bit j of qh[l]
void decode_k4(const uint8_t* raw, RowGroup& g, bool fifth) {
  const uint8_t* qh = raw + 16;
  const uint8_t* qs = raw + (fifth ? 48 : 16);
  copy_f16(g.f16[0], raw);
  copy_f16(g.f16[1], raw + 2);
  decode_k4_scales(raw + 4, g);
  for (int j = 0; j < kSuperBlocks; ++j) {
    const uint8_t* chunk = qs + kQBlock * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < kQBlock; ++l) g.u[j][l] = (chunk[l] >> shift) & 0x0F;
    if (fifth)
      for (int l = 0; l < kQBlock; ++l) g.u[j][l] |= ((qh[l] >> j) & 0x01) << 4;
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], D. Element 128 h + 32 t + l (block 4 h + t): its low 4 bits in
// ql[64 h + 32 (t % 2) + l] (nibble t / 2), its high 2 bits at bits 2 t of qh[32 h + l]; u = q + 32
void decode_q6_k(const uint8_t* raw, RowGroup& g) {
  const uint8_t* ql = raw;
  const uint8_t* qh = raw + 128;
  for (int j = 0; j < kSuperBlocks; ++j) {
    const int h = j / 4, t = j % 4;
    const uint8_t* low = ql + 64 * h + kQBlock * (t % 2);
    for (int l = 0; l < kQBlock; ++l)
      g.u[j][l] = ((low[l] >> (4 * (t / 2))) & 0x0F) | (((qh[kQBlock * h + l] >> (2 * t)) & 0x03) << 4);
  }
  std::memcpy(g.sub, raw + 192, 2 * kSuperBlocks);
  copy_f16(g.f16[0], raw + 208);
}

// IQ4_XS: D, scales_h (little-endian uint16: block j's high 2 bits at bits 2 j), scales_l[4] (block j's low
// 4 bits in byte j / 2, nibble j % 2), then each block's 16 bytes of nibbles as IQ4_NL's
void decode_iq4_xs(const uint8_t* raw, RowGroup& g) {
  const int high = raw[2] | (raw[3] << 8);
  copy_f16(g.f16[0], raw);
  for (int j = 0; j < kSuperBlocks; ++j) {
    const int low = (raw[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
    g.sub[j] = static_cast<uint8_t>(low | (((high >> (2 * j)) & 0x03) << 4));
    split_nibbles(raw + 8 + (kQBlock / 2) * j, g.u[j]);
  }
}

// Q3_K: hmask[32], qs[64], scales[12], D. Element 128 h + 32 t + l: its 2 low bits at bits 2 t of
// qs[32 h + l], its third bit at bit (block) 4 h + t of hmask[l]: u = q + 4. Sub-block s's 6-bit scale: low 4
// bits in byte s % 8 (nibble s / 8), high 2 at bits 2 (s / 4) of byte 8 + s % 4
void decode_q3_k(const uint8_t* raw, RowGroup& g) {
  const uint8_t* hmask = raw;
  const uint8_t* qs = raw + 32;
  const uint8_t* sc = raw + 96;
  for (int j = 0; j < kSuperBlocks; ++j) {
    const uint8_t* two = qs + kQBlock * (j / 4);
    const int shift = 2 * (j % 4);
    for (int l = 0; l < kQBlock; ++l) g.u[j][l] = ((two[l] >> shift) & 0x03) | (((hmask[l] >> j) & 0x01) << 2);
  }
  for (int s = 0; s < 2 * kSuperBlocks; ++s) {
    const int low = (sc[s % 8] >> (4 * (s / 8))) & 0x0F;
    g.sub[s] = static_cast<uint8_t>(low | (((sc[8 + s % 4] >> (2 * (s / 4))) & 0x03) << 4));
  }
  copy_f16(g.f16[0], raw + 108);
}

// Q2_K: scales[16] (sc | mn << 4 per 16 k), qs[64], D, Dmin. Element 128 h + 32 t + l at bits 2 t of qs[32 h + l]
void decode_q2_k(const uint8_t* raw, RowGroup& g) {
  const uint8_t* qs = raw + 16;
  std::memcpy(g.sub, raw, 2 * kSuperBlocks);
  for (int j = 0; j < kSuperBlocks; ++j) {
    const uint8_t* two = qs + kQBlock * (j / 4);
    const int shift = 2 * (j % 4);
    for (int l = 0; l < kQBlock; ++l) g.u[j][l] = (two[l] >> shift) & 0x03;
  }
  copy_f16(g.f16[0], raw + 80);
  copy_f16(g.f16[1], raw + 82);
}

// One row's (super-)block of the GGUF type base format F holds
template <int F>
void decode(const uint8_t* raw, RowGroup& g) {
  if constexpr (F == kQ8) decode_q8_0(raw, g);
  if constexpr (F == kQ4 || F == kQ4Z || F == kI4) decode_q4(raw, g, F == kQ4);
  if constexpr (F == kQ5 || F == kQ5Z) decode_q5(raw, g, F == kQ5);
  if constexpr (has_k4_head(F)) decode_k4(raw, g, F == kQ5S);
  if constexpr (F == kQ8S) decode_q6_k(raw, g);
  if constexpr (F == kI4S) decode_iq4_xs(raw, g);
  if constexpr (F == kQ3S) decode_q3_k(raw, g);
  if constexpr (F == kQ2S) decode_q2_k(raw, g);
}

// The 16 rows' float16 field ``which`` (0: d, 1: m) side by side; returns the end
uint8_t* put_f16(const RowGroup* rows, int which, uint8_t* out) {
  for (int c = 0; c < kPanel; ++c) copy_f16(out + 2 * c, rows[c].f16[which]);
  return out + kScaleBytes;
}

// The 16 rows' byte sub[s] side by side (Q8S, Q2S headers); returns the end
uint8_t* put_subs(const RowGroup* rows, int s, uint8_t* out) {
  for (int c = 0; c < kPanel; ++c) out[c] = rows[c].sub[s];
  return out + kPanel;
}

// The 16 rows' 6-bit sub[s] (I4S, Q3S): low 4 bits of rows c and c + 8 in byte c, high 2 bits of row c at
// bits 2 (c % 4) of byte 8 + c / 4; returns the end
uint8_t* put_six_bits(const RowGroup* rows, int s, uint8_t* out) {
  for (int c = 0; c < kPanel / 2; ++c) out[c] = (rows[c].sub[s] & 0x0F) | ((rows[c + kPanel / 2].sub[s] & 0x0F) << 4);
  for (int b = 0; b < kPanel / 4; ++b) {
    int high = 0;
    for (int t = 0; t < 4; ++t) high |= (rows[4 * b + t].sub[s] >> 4) << (2 * t);
    out[kPanel / 2 + b] = static_cast<uint8_t>(high);
  }
  return out + kSixBitScales;
}

// Q4S, Q5S block j's high bits of the 16 rows' sub-scale and sub-min (nibble sc_hi | mn_hi << 2; rows c and
// c + 8 in byte c); returns the end
uint8_t* put_k4_high(const RowGroup* rows, int j, uint8_t* out) {
  const auto nibble = [&](int c) { return (rows[c].sub[j] >> 4) | ((rows[c].sub_min[j] >> 4) << 2); };
  for (int c = 0; c < kPanel / 2; ++c) out[c] = static_cast<uint8_t>(nibble(c) | (nibble(c + kPanel / 2) << 4));
  return out + kPanel / 2;
}

// A super-tile's header (group_head(F) bytes; nothing for the 32-blocks' formats); returns the end
template <int F>
uint8_t* put_head(const RowGroup* rows, uint8_t* out) {
  if constexpr (has_k4_head(F)) {
    out = put_f16(rows, 1, put_f16(rows, 0, out));
    for (int j = 0; j < kSuperBlocks; ++j) out = put_k4_high(rows, j, out);
  } else if constexpr (F == kQ8S || F == kQ2S) {
    out = put_f16(rows, 0, out);
    if constexpr (F == kQ2S) out = put_f16(rows, 1, out);
    for (int s = 0; s < 2 * kSuperBlocks; ++s) out = put_subs(rows, s, out);
  } else if constexpr (F == kI4S || F == kQ3S) {
    out = put_f16(rows, 0, out);
    for (int s = 0; s < (F == kQ3S ? 2 : 1) * kSuperBlocks; ++s) out = put_six_bits(rows, s, out);
  }
  return out;
}

// Block j's tile scale bytes (scale_bytes(F): d, m float16; Q4S, Q5S: the sub-scales' and sub-mins' low
// 4 bits, sc_lo | mn_lo << 4); returns the end
template <int F>
uint8_t* put_tile_scales(const RowGroup* rows, int j, uint8_t* out) {
  if constexpr (has_k4_head(F)) {
    for (int c = 0; c < kPanel; ++c) out[c] = (rows[c].sub[j] & 0x0F) | ((rows[c].sub_min[j] & 0x0F) << 4);
    return out + kPanel;
  } else if constexpr (group_blocks(F) == 1) {
    out = put_f16(rows, 0, out);
    return has_min(F) ? put_f16(rows, 1, out) : out;
  }
  return out;
}

uint32_t load4(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

void store4(uint8_t* p, uint32_t w) { std::memcpy(p, &w, 4); }

// Block j's quant planes in the dot layout: 4-byte quads of k per row, each built from a row's own 4 quants
// as a word (every operation stays within a byte: the same bytes on any CPU). Each writer returns its end.
struct DotQuants {
  const RowGroup* rows;
  int j;

  uint32_t quad(int c, int k) const { return load4(rows[c].u[j] + k); }  // row c's quants k .. k + 3

  // Q8: 8 quads x 16 rows x 4 bytes, each q ^ 0x80
  uint8_t* bytes(uint8_t* out) const {
    for (int c = 0; c < kPanel; ++c)
      for (int q = 0; q < kQuads; ++q) store4(out + (q * kPanel + c) * 4, quad(c, 4 * q) ^ 0x80808080u);
    return out + kQBlock * kPanel;
  }
  // the low 4 bits: 4 chunks x 16 rows x 4 bytes, quad q in chunk q's low nibbles, quad q + 4 in its high ones
  uint8_t* nibbles(uint8_t* out) const {
    for (int c = 0; c < kPanel; ++c)
      for (int q = 0; q < kQuads / 2; ++q)
        store4(out + (q * kPanel + c) * 4,
               (quad(c, 4 * q) & 0x0F0F0F0Fu) | ((quad(c, kQBlock / 2 + 4 * q) & 0x0F0F0F0Fu) << 4));
    return out + kQBlock * kPanel / 2;
  }
  // (u >> shift) & 3: 2 chunks x 16 rows x 4 bytes, quad 4 h + t at bits 2 t of chunk h
  uint8_t* two_bits(int shift, uint8_t* out) const {
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < kPanel; ++c) {
        uint32_t w = 0;
        for (int t = 0; t < 4; ++t) w |= ((quad(c, 16 * h + 4 * t) >> shift) & 0x03030303u) << (2 * t);
        store4(out + (h * kPanel + c) * 4, w);
      }
    return out + kQBlock * kPanel / 4;
  }
  // (u >> shift) & 1: 16 rows x 4 bytes, quad q's bits at bit q
  uint8_t* bits(int shift, uint8_t* out) const {
    for (int c = 0; c < kPanel; ++c) {
      uint32_t w = 0;
      for (int q = 0; q < kQuads; ++q) w |= ((quad(c, 4 * q) >> shift) & 0x01010101u) << q;
      store4(out + c * 4, w);
    }
    return out + kQBlock * kPanel / 8;
  }
};

// Block j's quant planes in the plain layout ([32 k] rows of the 16 rows' values), written in order, each
// byte gathered from the rows it holds. Each writer returns its end.
struct PlainQuants {
  const RowGroup* rows;
  int j;

  uint8_t at(int c, int k) const { return rows[c].u[j][k]; }

  // Q8: [32 k][16 rows]
  uint8_t* bytes(uint8_t* out) const {
    for (int k = 0; k < kQBlock; ++k)
      for (int c = 0; c < kPanel; ++c) out[k * kPanel + c] = at(c, k);
    return out + kQBlock * kPanel;
  }
  // the low 4 bits: per k, rows c and c + 8 in byte c's low and high nibbles
  uint8_t* nibbles(uint8_t* out) const {
    for (int k = 0; k < kQBlock; ++k)
      for (int c = 0; c < kPanel / 2; ++c)
        out[k * (kPanel / 2) + c] = (at(c, k) & 0x0F) | ((at(c + kPanel / 2, k) & 0x0F) << 4);
    return out + kQBlock * kPanel / 2;
  }
  // (u >> shift) & 3: per k 4 bytes, row c at bits 2 (c % 4) of byte c / 4
  uint8_t* two_bits(int shift, uint8_t* out) const {
    for (int k = 0; k < kQBlock; ++k)
      for (int b = 0; b < kPanel / 4; ++b) {
        int byte = 0;
        for (int i = 0; i < 4; ++i) byte |= ((at(4 * b + i, k) >> shift) & 0x03) << (2 * i);
        out[k * (kPanel / 4) + b] = static_cast<uint8_t>(byte);
      }
    return out + kQBlock * kPanel / 4;
  }
  // (u >> shift) & 1: per k 2 bytes, row c at bit c % 8 of byte c / 8
  uint8_t* bits(int shift, uint8_t* out) const {
    for (int k = 0; k < kQBlock; ++k)
      for (int a = 0; a < 2; ++a) {
        int byte = 0;
        for (int i = 0; i < 8; ++i) byte |= ((at(8 * a + i, k) >> shift) & 0x01) << i;
        out[k * 2 + a] = static_cast<uint8_t>(byte);
      }
    return out + kQBlock * kPanel / 8;
  }
};

// A block's quant planes, low bits first (quant_pack.py PLANES), by Q's writers; returns the end
template <int F, class Q>
uint8_t* put_planes(const Q& q, uint8_t* out) {
  if constexpr (F == kQ8) return q.bytes(out);
  if constexpr (F == kQ2S) return q.two_bits(0, out);
  if constexpr (F == kQ3S) return q.bits(2, q.two_bits(0, out));
  out = q.nibbles(out);
  if constexpr (F == kQ8S) out = q.two_bits(4, out);
  if constexpr (has_fifth_bit(F)) out = q.bits(4, out);
  return out;
}

// Block j's quants in the dot layout (Dot) or the plain one; returns the end
template <int F, bool Dot>
uint8_t* put_quants(const RowGroup* rows, int j, uint8_t* out) {
  if constexpr (Dot) {
    return put_planes<F>(DotQuants{rows, j}, out);
  } else {
    return put_planes<F>(PlainQuants{rows, j}, out);
  }
}

// Panel p: per (super-)block, the 16 rows decoded (zeros past N), then its header and block tiles written
template <int F, bool Dot>
void repack_panel(const RepackArgs& a, int64_t p) {
  constexpr int64_t group = group_blocks(F), raw_bytes = gguf_block_bytes(F);
  const int64_t entries = a.K / (kQBlock * group);
  const uint8_t* src[kPanel];  // each row's blocks, nullptr past N
  for (int c = 0; c < kPanel; ++c) {
    const int64_t r = p * kPanel + c;
    src[c] = r < a.n ? a.rows[r] : nullptr;
  }
  uint8_t* out = a.out + p * entries * group_bytes(F);
  RowGroup rows[kPanel];
  for (int64_t e = 0; e < entries; ++e) {
    for (int c = 0; c < kPanel; ++c) {
      if (src[c]) decode<F>(src[c] + e * raw_bytes, rows[c]);
      else std::memset(&rows[c], 0, sizeof(RowGroup));
    }
    out = put_head<F>(rows, out);
    for (int j = 0; j < group; ++j) out = put_quants<F, Dot>(rows, j, put_tile_scales<F>(rows, j, out));
  }
}

template <int F, bool Dot>
void repack_range(const RepackArgs& a, int64_t begin, int64_t end) {
  for (int64_t p = begin; p < end; ++p) repack_panel<F, Dot>(a, p);
}

}  // namespace

void repack_panels(const RepackArgs& a, int64_t begin, int64_t end) {
  const bool dot = is_dot_format(a.format);
  switch (base_format(a.format)) {
#define NXK_REPACK(f)                                                         \
  case f:                                                                     \
    return dot ? repack_range<f, true>(a, begin, end) : repack_range<f, false>(a, begin, end);
    NXK_REPACK(kQ8) NXK_REPACK(kQ4) NXK_REPACK(kQ4S) NXK_REPACK(kQ8S) NXK_REPACK(kQ5S) NXK_REPACK(kI4)
    NXK_REPACK(kI4S) NXK_REPACK(kQ3S) NXK_REPACK(kQ2S) NXK_REPACK(kQ5) NXK_REPACK(kQ5Z) NXK_REPACK(kQ4Z)
#undef NXK_REPACK
  }
}

template <int Bytes>
void pack_float_panels(const uint8_t* const* rows, int64_t n, int64_t K, uint8_t* out, int64_t begin, int64_t end) {
  using Value = std::conditional_t<Bytes == 2, uint16_t, uint32_t>;  // the bits, copied as they are
  for (int64_t p = begin; p < end; ++p) {
    const uint8_t* src[kPanel];  // each row's values, nullptr past N
    for (int c = 0; c < kPanel; ++c) src[c] = p * kPanel + c < n ? rows[p * kPanel + c] : nullptr;
    Value* panel = reinterpret_cast<Value*>(out) + p * K * kPanel;  // [K][16]
    for (int64_t k = 0; k < K; ++k) {
      for (int c = 0; c < kPanel; ++c) {
        Value v = 0;
        if (src[c]) std::memcpy(&v, src[c] + k * Bytes, Bytes);
        panel[k * kPanel + c] = v;
      }
    }
  }
}

template void pack_float_panels<2>(const uint8_t* const*, int64_t, int64_t, uint8_t*, int64_t, int64_t);
template void pack_float_panels<4>(const uint8_t* const*, int64_t, int64_t, uint8_t*, int64_t, int64_t);

}  // namespace nxk
