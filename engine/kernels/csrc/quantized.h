// Linear layers over weights kept quantized: each weight is dequantized in registers to exactly the
// float32 value gguf's reference dequantizer gives, then used as in kernels.h's linear. So every
// output is the same fma chain over k = 0..K-1 as the float32 path over the dequantized weight, bit
// for bit: the quantized path inherits that path's invariance and its agreement is exact.
//
// Packed layout ([P, K / 32, tile bytes] uint8, built once at load by engine/kernels/quant_pack.py):
// per panel of 16 output columns and block of 32 k, one tile, as many bytes as GGUF's 16 blocks
//   Q8   d[16] float16, then q[32][16] int8                      w = q * d
//   Q4   d[16] float16, m[16] float16, then q[32][8] bytes:      w = fma(q, d, m)
//        byte j of a row holds column j in its low nibble and column j + 8 in its high nibble
//   Q4S  Q4_K at the file's size: per super-block of 256 k (8 blocks) one super-tile (2304 bytes, the
//        16 GGUF blocks' 144 each): D[16] float16, Dmin[16] float16, then per block j 8 bytes of the
//        6-bit sub-scales' and sub-mins' high 2 bits (column c: nibble sc_hi | mn_hi << 2, columns c
//        and c + 8 in byte c's low and high nibble), then the 8 block tiles: lo[16] (column c: byte
//        sc_lo | mn_lo << 4), then q[32][8] bytes as Q4.  d = D * sc, m = -(Dmin * mn), w = fma(q, d, m)
//   Q8S  Q6_K at the file's size: per super-block of 256 k one super-tile (3360 bytes, 16 x 210): D[16]
//        float16, then sc[16][16] int8 (sub-block of 16 k, column), then the 8 block tiles: the 6-bit
//        quants u = q + 32 as a low plane, u & 15 in q[32][8] bytes as Q4 (256), and a high plane, u >> 4
//        in 2 bits (128: row k's 4 bytes hold column c at bits 2c).  w = (u - 32) * D * sc
//   Q5S  Q5_K at the file's size: Q4S with a fifth bit (2816 bytes per super-tile, 16 x 176): the header and
//        each block tile's sub-scale bytes and nibbles as Q4S's, then a bit plane of 64 bytes (row k's 2
//        bytes hold column c at bit c): u = nibble | bit << 4 (0..31).  w = fma(u, d, m) as Q4S
//   I4   IQ4_NL: d[16] float16, then nibbles as Q4, each an index into IQ4's 16 int8 values: w = kIQ4[q] * d
//   I4S  IQ4_XS at the file's size: per super-block of 256 k one super-tile (2176 bytes, 16 x 136): D[16]
//        float16, then per block j 12 bytes of 6-bit sub-scales (8: column c's low 4 bits in byte c % 8,
//        columns 8.. in the high nibbles; 4: its high 2 bits at bits 2 (c % 4) of byte c / 4), then the 8
//        block tiles' nibbles as I4's.  w = kIQ4[q] * D * (sc - 32)
//   Q3S  Q3_K at the file's size: per super-block of 256 k one super-tile (1760 bytes, 16 x 110): D[16]
//        float16, then the 16 sub-blocks' (16 k each) 6-bit scales, 12 bytes each as I4S's, then the 8
//        block tiles: the 3-bit u = q + 4 as a 2-bit plane (128: row k's 4 bytes hold column c at bits
//        2c, as Q8S's high plane) and a bit plane (64, as Q5S's).  w = (u - 4) * D * (sc - 32)
//   Q2S  Q2_K at the file's size: per super-block of 256 k one super-tile (1344 bytes, 16 x 84): D[16] and
//        Dmin[16] float16, then the 16 sub-blocks' bytes sc | mn << 4 ([16 sub-blocks][16]), then the 8
//        block tiles' 2-bit quants as Q3S's 2-bit plane.  per sub-block d = D * sc, m = -(Dmin * mn),
//        w = fma(q, d, m)
//   Q5   Q5_1: Q4's tile with a bit plane after its nibbles as Q5S's: u = nibble | bit << 4, w = fma(u, d, m)
//   Q5Z  Q5_0: d[16] float16, the nibbles, the bit plane: w = (u - 16) * d
//   Q4Z  Q4_0: d[16] float16, the nibbles: w = (u - 8) * d
// GGUF's Q8_0 is Q8; Q4_1 is Q4 with its own min m. Every product q * d is exact in float32 (an 11-bit f16
// scale times at most 8 bits), so fma(q, d, m) is gguf's d * q + m, and (u - 8) * d gguf's Q4_0 value.
// Q4_K is Q4S: its sub-block scale d = D * sc and min m = -(Dmin * mn) are exact float32 products (11
// bits times 6), formed per block in registers (block_head), and q * d is exact (21 bits), so fma(q, d, m)
// is gguf's d * q - dm; Q5_K's Q5S the same with u <= 31 (q * d at most 22 bits). Q6_K is Q8S: a scale per 16 k, D * sc exact (11 bits times 8) and formed per block
// in registers too, q * d exact (at most 24 bits). IQ4_XS's D * (sc - 32) is exact (11 bits times 6) and so
// is its product with an IQ4 value (7 bits more): every I4, I4S weight is gguf's value too; so is Q3_K's
// Q3S, D * (sc - 32) times q in -4..3; and Q2_K's Q2S, whose D * sc (11 bits times 4) times q (2 bits)
// is exact, so fma(q, d, m) is gguf's d * q - dm.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace nxk {

constexpr int64_t kQBlock = 32;  // k per quantization block (GGUF's QK8_0, QK4_0, QK4_1)
// The base formats, one per weight type; the kernel tables (table.h) hold one entry per base format and
// route, filled by a loop over them: a new weight type is a new value here (before kBaseFormats).
enum QFormat : int { kQ8 = 0, kQ4 = 1, kQ4S = 2, kQ8S = 3, kQ5S = 4, kI4 = 5, kI4S = 6, kQ3S = 7, kQ2S = 8, kQ5 = 9, kQ5Z = 10, kQ4Z = 11, kBaseFormats };

// IQ4_NL's and IQ4_XS's 16 values (gguf's kvalues), indexed by a nibble
constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// What a base format's block carries: a min per column (w = fma(q, d, m)); Q4_K's header of a super-block
// scale and min with 6-bit sub-scales and sub-mins (Q4S, Q5S); scales formed per block as float32 (the K types)
constexpr bool has_min(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ4 || f == kQ4S || f == kQ5S || f == kQ2S || f == kQ5;
}
constexpr bool has_k4_head(int64_t format) { return format % kBaseFormats == kQ4S || format % kBaseFormats == kQ5S; }
// Base formats with one scale (Q2S: and one min) per half block (16 k): the sub-blocks of Q6_K, Q3_K, Q2_K
constexpr bool has_half_scales(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ8S || f == kQ3S || f == kQ2S;
}
constexpr bool has_formed_scales(int64_t format) {
  return has_k4_head(format) || has_half_scales(format) || format % kBaseFormats == kI4S;
}
// What a format's stored unsigned quant u exceeds the signed q by (q = u - offset)
constexpr int32_t quant_offset(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ8S ? 32 : f == kQ3S ? 4 : f == kQ5Z ? 16 : f == kQ4Z ? 8 : 0;
}
// Base formats whose quants have a fifth bit in a bit plane after their nibbles
constexpr bool has_fifth_bit(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ5S || f == kQ5 || f == kQ5Z;
}
// The IQ4 types: each nibble an index into kIQ4Values
constexpr bool is_iq4(int64_t format) { return format % kBaseFormats == kI4 || format % kBaseFormats == kI4S; }

constexpr int64_t kScaleBytes = kPanel * 2;  // 16 float16 scales (or mins)
constexpr int64_t kWideScaleBytes = kPanel * 4;  // 16 float32 scales (or mins)

constexpr int64_t kSuperBlocks = 8;  // Q4S: blocks per super-block (GGUF's QK_K = 256 k)
constexpr int64_t kQ4SHead = 2 * kScaleBytes + kSuperBlocks * kPanel / 2;  // a Q4S super-tile's header
constexpr int64_t kQ8SHead = kScaleBytes + 2 * kSuperBlocks * kPanel;  // a Q8S super-tile's header
constexpr int64_t kSixBitScales = kPanel / 2 + kPanel / 4;  // 16 columns' 6-bit scales (I4S, Q3S): 4 + 2 bits
constexpr int64_t kI4SHead = kScaleBytes + kSuperBlocks * kSixBitScales;  // an I4S super-tile's header
constexpr int64_t kQ3SHead = kScaleBytes + 2 * kSuperBlocks * kSixBitScales;  // a Q3S super-tile's header
constexpr int64_t kTwoBitPlane = kQBlock * kPanel / 4;  // Q3S: a block tile's 2-bit plane, before its bit plane
constexpr int64_t kQ2SHead = 2 * kScaleBytes + 2 * kSuperBlocks * kPanel;  // a Q2S super-tile's header
// A block's scale header formed as float32 (block_head): 16 columns' scale of k 0..15 (or of the whole block),
// then the min (Q4S, Q5S) or the scale of k 16..31 (Q8S, Q3S, Q2S), then Q2S's mins of k 0..15 and 16..31
constexpr int64_t kHeadFloats = 4 * kPanel;
// Which field of a formed header holds the min of half block ``half`` (0, 1)
constexpr int min_field(int64_t format, int half) { return format % kBaseFormats == kQ2S ? 2 + half : 1; }
constexpr int64_t kLowPlane = kQBlock * kPanel / 2;  // Q8S, Q5S: a block tile's low plane, before its high one

// Bytes of one block's tile (Q4S: after its super-tile's header). Format + kBaseFormats, the same tile in qdot.h's
// dot layout, has the same size.
constexpr int64_t tile_bytes(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ8    ? kScaleBytes + kQBlock * kPanel
         : f == kQ4  ? 2 * kScaleBytes + kQBlock * kPanel / 2
         : f == kI4  ? kScaleBytes + kQBlock * kPanel / 2
         : f == kI4S ? kQBlock * kPanel / 2
         : f == kQ3S ? kTwoBitPlane + kQBlock * kPanel / 8
         : f == kQ2S ? kTwoBitPlane
         : f == kQ5  ? 2 * kScaleBytes + kLowPlane + kQBlock * kPanel / 8
         : f == kQ5Z ? kScaleBytes + kLowPlane + kQBlock * kPanel / 8
         : f == kQ4Z ? kScaleBytes + kLowPlane
         : f == kQ4S ? kPanel + kQBlock * kPanel / 2
         : f == kQ5S ? kPanel + kLowPlane + kQBlock * kPanel / 8
                     : kLowPlane + kQBlock * kPanel / 4;
}
// Bytes of a tile's own header, before its quants (Q4S: the low bits of its sub-scales and sub-mins)
constexpr int64_t scale_bytes(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ8 || f == kI4 || f == kQ5Z || f == kQ4Z ? kScaleBytes
         : f == kQ4 || f == kQ5                          ? 2 * kScaleBytes
         : has_k4_head(f)                                ? kPanel
                                                         : 0;
}
// Blocks per entry of a packed weight's last dimension, and that entry's bytes (a super-tile for the K types)
constexpr int64_t group_blocks(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return f == kQ8 || f == kQ4 || f == kI4 || f == kQ5 || f == kQ5Z || f == kQ4Z ? 1 : kSuperBlocks;
}
constexpr int64_t group_head(int64_t format) {
  const int64_t f = format % kBaseFormats;
  return has_k4_head(f) ? kQ4SHead : f == kQ8S ? kQ8SHead : f == kI4S ? kI4SHead : f == kQ3S ? kQ3SHead : f == kQ2S ? kQ2SHead : 0;
}
constexpr int64_t group_bytes(int64_t format) { return group_head(format) + group_blocks(format) * tile_bytes(format); }
// Bytes of one panel of a [N, K] weight
constexpr int64_t panel_bytes_of(int64_t format, int64_t K) {
  return K / (kQBlock * group_blocks(format)) * group_bytes(format);
}

// (The helpers below that are not templated on a vector struct are static: each instruction set's file
// compiles its own copy for its own target, and none can be linked into another's path.)

// Block b's tile within a panel
template <int F>
static inline const uint8_t* tile_at(const uint8_t* panel, int64_t b) {
  if constexpr (group_blocks(F) > 1)
    return panel + (b / kSuperBlocks) * group_bytes(F) + group_head(F) + (b % kSuperBlocks) * tile_bytes(F);
  return panel + b * tile_bytes(F);
}

// Block b's quants within a panel
template <int F>
static inline const uint8_t* block_quants(const uint8_t* panel, int64_t b) {
  return tile_at<F>(panel, b) + scale_bytes(F);
}

// Q4S (Q5S) block b's scales and mins per column, as float32 d[16] then m[16] into out: d = D * sc and
// m = -(Dmin * mn), exact products whichever instruction forms them
template <int F>
static inline void q4s_block_scales(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(F);
  const int64_t j = b % kSuperBlocks;
  const uint16_t* d = reinterpret_cast<const uint16_t*>(super);
  const uint8_t* high = super + 2 * kScaleBytes + j * (kPanel / 2);
  const uint8_t* low = super + kQ4SHead + j * tile_bytes(F);
  for (int64_t c = 0; c < kPanel; ++c) {
    const int h = c < kPanel / 2 ? high[c] & 0x0F : high[c - kPanel / 2] >> 4;
    const int sc = (low[c] & 0x0F) | ((h & 0x03) << 4), mn = (low[c] >> 4) | ((h >> 2) << 4);
    out[c] = f16_to_float(d[c]) * static_cast<float>(sc);
    out[kPanel + c] = -(f16_to_float(d[kPanel + c]) * static_cast<float>(mn));
  }
}

// Q8S block b's two scales per column (k 0..15, k 16..31), D * sc, as float32 d[16] then e[16] into out
static inline void q8s_block_scales(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ8S);
  const uint16_t* d = reinterpret_cast<const uint16_t*>(super);
  const int8_t* sc = reinterpret_cast<const int8_t*>(super + kScaleBytes) + (b % kSuperBlocks) * 2 * kPanel;
  for (int64_t c = 0; c < kPanel; ++c) {
    const float dc = f16_to_float(d[c]);
    out[c] = dc * static_cast<float>(sc[c]);
    out[kPanel + c] = dc * static_cast<float>(sc[kPanel + c]);
  }
}

// 16 columns' D * (sc - 32) into out, from their float16 D and 6-bit scales sc (kSixBitScales bytes at
// ``six``: column c's low 4 bits in byte c % 8, columns 8.. in the high nibbles; its high 2 bits at bits
// 2 (c % 4) of byte 8 + c / 4): exact products
static inline void signed_six_bit_scales(const uint8_t* super, const uint8_t* six, float* out) {
  const uint16_t* d = reinterpret_cast<const uint16_t*>(super);
  for (int64_t c = 0; c < kPanel; ++c) {
    const int lo = c < kPanel / 2 ? six[c] & 0x0F : six[c - kPanel / 2] >> 4;
    const int sc = lo | (((six[kPanel / 2 + c / 4] >> (2 * (c % 4))) & 0x03) << 4);
    out[c] = f16_to_float(d[c]) * static_cast<float>(sc - 32);
  }
}

// I4S block b's scales D * (sc - 32) per column, as float32 d[16] (then 16 zeros) into out
static inline void i4s_block_scales(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kI4S);
  signed_six_bit_scales(super, super + kScaleBytes + (b % kSuperBlocks) * kSixBitScales, out);
  std::fill(out + kPanel, out + 2 * kPanel, 0.0f);
}

// Q3S block b's two scales per column (its sub-blocks 2j, 2j + 1), as float32 d[16] then e[16] into out
static inline void q3s_block_scales(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ3S);
  const uint8_t* six = super + kScaleBytes + (b % kSuperBlocks) * 2 * kSixBitScales;
  signed_six_bit_scales(super, six, out);
  signed_six_bit_scales(super, six + kSixBitScales, out + kPanel);
}

// Q2S block b's scales D * sc and mins -(Dmin * mn) of its two sub-blocks, into out as kHeadFloats
static inline void q2s_block_scales(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ2S);
  const uint16_t* d = reinterpret_cast<const uint16_t*>(super);
  const uint8_t* subs = super + 2 * kScaleBytes + (b % kSuperBlocks) * 2 * kPanel;
  for (int half = 0; half < 2; ++half)
    for (int64_t c = 0; c < kPanel; ++c) {
      const int byte = subs[half * kPanel + c];
      out[half * kPanel + c] = f16_to_float(d[c]) * static_cast<float>(byte & 0x0F);
      out[(2 + half) * kPanel + c] = -(f16_to_float(d[kPanel + c]) * static_cast<float>(byte >> 4));
    }
}

// Block b's scales formed into buf (kHeadFloats), for a format with formed scales (has_formed_scales)
template <int F>
static inline void block_scales(const uint8_t* panel, int64_t b, float* buf) {
  constexpr int f = F % kBaseFormats;
  if constexpr (has_k4_head(f)) q4s_block_scales<f>(panel, b, buf);
  if constexpr (f == kQ8S) q8s_block_scales(panel, b, buf);
  if constexpr (f == kI4S) i4s_block_scales(panel, b, buf);
  if constexpr (f == kQ3S) q3s_block_scales(panel, b, buf);
  if constexpr (f == kQ2S) q2s_block_scales(panel, b, buf);
}

// Where block b's scale header is read from: its tile's own header, except for the K types, whose
// scales are formed into ``buf`` (kHeadFloats floats, laid out as kHeadFloats says): the same header the
// readers below take for every float32 scale.
template <int F>
static inline const uint8_t* block_head(const uint8_t* panel, int64_t b, float* buf) {
  if constexpr (has_formed_scales(F)) {
    block_scales<F>(panel, b, buf);
    return reinterpret_cast<const uint8_t*>(buf);
  } else {
    return tile_at<F>(panel, b);
  }
}

// Q8S: the high 2 bits of column c's quant at k (0..31) of a block tile's quants, as plain tiles hold them
static inline int32_t q8s_high(const uint8_t* quants, int64_t k, int64_t c) {
  return (quants[kLowPlane + k * 4 + c / 4] >> (2 * (c % 4))) & 0x03;
}

// Q5S: the fifth bit of column c's quant at k (0..31) of a block tile's quants, as plain tiles hold them
static inline int32_t q5s_high(const uint8_t* quants, int64_t k, int64_t c) {
  return (quants[kLowPlane + k * 2 + c / 8] >> (c % 8)) & 0x01;
}

// One field of a block's scale header (block_head) for column c: which = 0 its scale d, which = 1 its
// second field (Q4, Q4S, Q5S: the min m; Q8S, Q3S, Q2S: the scale of k 16..31; Q8, I4, I4S: none, 0);
// Q2S's third and fourth, its mins (kHeadFloats)
template <int F>
inline float tile_field(const uint8_t* tile, int which, int64_t c) {
  if constexpr (has_formed_scales(F)) return reinterpret_cast<const float*>(tile)[which * kPanel + c];
  if constexpr (!has_min(F)) {
    if (which == 1) return 0.0f;
  }
  return f16_to_float(reinterpret_cast<const uint16_t*>(tile)[which * kPanel + c]);
}

// Q3S: the quant of column c at k (0..31) of a block tile's quants, as plain tiles hold them
static inline int32_t q3s_quant(const uint8_t* quants, int64_t k, int64_t c) {
  const int32_t two = (quants[k * 4 + c / 4] >> (2 * (c % 4))) & 0x03;
  const int32_t bit = (quants[kTwoBitPlane + k * 2 + c / 8] >> (c % 8)) & 0x01;
  return (two | (bit << 2)) - quant_offset(kQ3S);
}

// The quant of column c at k (0..31) of a tile's quants, in this file's layout.
template <int F>
inline int32_t tile_quant(const uint8_t* quants, int64_t k, int64_t c) {
  if constexpr (F == kQ8) return reinterpret_cast<const int8_t*>(quants)[k * kPanel + c];
  if constexpr (F == kQ3S) return q3s_quant(quants, k, c);
  if constexpr (F == kQ2S) return (quants[k * 4 + c / 4] >> (2 * (c % 4))) & 0x03;
  const uint8_t byte = quants[k * (kPanel / 2) + c % 8];
  const int32_t low = c < 8 ? byte & 0x0F : byte >> 4;
  if constexpr (F == kQ8S) return (low | (q8s_high(quants, k, c) << 4)) - 32;
  if constexpr (is_iq4(F)) return kIQ4Values[low];
  if constexpr (has_fifth_bit(F)) return (low | (q5s_high(quants, k, c) << 4)) - quant_offset(F);
  return low - quant_offset(F);
}

// One block's scales in registers; ``at(kk)`` gives row kk's 16 weights as two vectors. An instruction set
// may derive its own tile (isa_avx2.cpp's QTile8) that forms the same header and quants its own way and
// shares load_scales and combine: the same weights, bit for bit.
template <class O, int F>
struct QTile {
  using V = typename O::V;
  const uint8_t* quants;
  V d0, d1, m0, m1;  // Q8S, Q3S, Q2S: m holds the scales of k 16..31
  V n0, n1, n2, n3;  // Q2S: the mins of k 0..15 (n0, n1) and of k 16..31 (n2, n3)

  QTile(const uint8_t* panel, int64_t b) : quants(block_quants<F>(panel, b)) {
    float buf[kHeadFloats];
    load_scales(block_head<F>(panel, b, buf));
  }

  void at(int64_t kk, V& w0, V& w1) const {
    V q0, q1;
    if constexpr (F == kQ8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(quants) + kk * kPanel;
      q0 = O::load_i8(q), q1 = O::load_i8(q + kLanes);
    } else if constexpr (F == kQ4 || F == kQ4S) {
      O::load_nibbles(quants + kk * (kPanel / 2), q0, q1);
    } else {
      int8_t q[kPanel];  // the row's quants: signed values, or 5-bit ones (Q5S, Q5), from their planes
      for (int64_t c = 0; c < kPanel; ++c) q[c] = static_cast<int8_t>(tile_quant<F>(quants, kk, c));
      q0 = O::load_i8(q), q1 = O::load_i8(q + kLanes);
    }
    combine(kk, q0, q1, w0, w1);
  }

 protected:
  explicit QTile(const uint8_t* block_quants_at) : quants(block_quants_at) {}

  // the scales (and mins) of a block header as block_head forms it
  void load_scales(const uint8_t* head) {
    if constexpr (has_formed_scales(F)) {
      const float* d = reinterpret_cast<const float*>(head);
      d0 = O::load(d);
      d1 = O::load(d + kLanes);
      m0 = O::load(d + kPanel);
      m1 = O::load(d + kPanel + kLanes);
      if constexpr (F == kQ2S) {
        n0 = O::load(d + 2 * kPanel);
        n1 = O::load(d + 2 * kPanel + kLanes);
        n2 = O::load(d + 3 * kPanel);
        n3 = O::load(d + 3 * kPanel + kLanes);
      }
      return;
    }
    const uint16_t* d = reinterpret_cast<const uint16_t*>(head);
    d0 = O::load_f16(d);
    d1 = O::load_f16(d + kLanes);
    if constexpr (has_min(F)) {  // Q4, Q5
      m0 = O::load_f16(d + kPanel);
      m1 = O::load_f16(d + kPanel + kLanes);
    } else {
      m0 = m1 = O::zero();
    }
  }

  // row kk's weights from its quants as floats (q0: columns 0..7 of the panel's lanes, q1 the rest)
  void combine(int64_t kk, V q0, V q1, V& w0, V& w1) const {
    const bool low = kk < kQBlock / 2;
    if constexpr (F == kQ2S) {
      w0 = O::fma(q0, low ? d0 : m0, low ? n0 : n2);
      w1 = O::fma(q1, low ? d1 : m1, low ? n1 : n3);
    } else if constexpr (has_half_scales(F)) {
      w0 = O::mul(q0, low ? d0 : m0);
      w1 = O::mul(q1, low ? d1 : m1);
    } else if constexpr (!has_min(F)) {  // Q8, IQ4, Q5Z, Q4Z
      w0 = O::mul(q0, d0);
      w1 = O::mul(q1, d1);
    } else {  // Q4, Q4S, Q5S, Q5
      w0 = O::fma(q0, d0, m0);
      w1 = O::fma(q1, d1, m1);
    }
  }
};

// R rows (R <= kRowTile) x NP adjacent panels, weights dequantized in registers. Several panels keep
// more independent fma chains in flight when there are few rows; each output's chain is unchanged.
template <class O, int F, int R, int NP, class Tile = QTile<O, F>>
void qlinear_tile(const float* xt, int64_t K, const uint8_t* panel, int64_t panel_bytes, float* y,
                  int64_t ldy, const int64_t* cols) {
  using V = typename O::V;
  V acc[R][2 * NP];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * NP; ++j) acc[r][j] = O::zero();
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const Tile t0(panel, b);
    const Tile t1(panel + (NP > 1 ? panel_bytes : 0), b);
    for (int64_t kk = 0; kk < kQBlock; ++kk) {
      const float* xk = xt + (b * kQBlock + kk) * kRowTile;
      V w[2 * NP];
      t0.at(kk, w[0], w[1]);
      if constexpr (NP > 1) t1.at(kk, w[2], w[3]);
      for (int r = 0; r < R; ++r) {
        const V xb = O::set1(xk[r]);
        for (int j = 0; j < 2 * NP; ++j) acc[r][j] = O::fma(xb, w[j], acc[r][j]);
      }
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int r = 0; r < R; ++r) store_columns<O>(y + r * ldy + p * kPanel, acc[r][2 * p], acc[r][2 * p + 1], cols[p]);
}

template <class O, int F, int NP, class Tile = QTile<O, F>>
void qlinear_tile_rows(int64_t rows, const float* xt, int64_t K, const uint8_t* panel, int64_t panel_bytes,
                       float* y, int64_t ldy, const int64_t* cols) {
  switch (rows) {
    case 6: qlinear_tile<O, F, 6, NP, Tile>(xt, K, panel, panel_bytes, y, ldy, cols); break;
    case 5: qlinear_tile<O, F, 5, NP, Tile>(xt, K, panel, panel_bytes, y, ldy, cols); break;
    case 4: qlinear_tile<O, F, 4, NP, Tile>(xt, K, panel, panel_bytes, y, ldy, cols); break;
    case 3: qlinear_tile<O, F, 3, NP, Tile>(xt, K, panel, panel_bytes, y, ldy, cols); break;
    case 2: qlinear_tile<O, F, 2, NP, Tile>(xt, K, panel, panel_bytes, y, ldy, cols); break;
    default: qlinear_tile<O, F, 1, NP, Tile>(xt, K, panel, panel_bytes, y, ldy, cols); break;
  }
}

// panel p dequantized into buf [K, 16] float32 (the layout kernels.h's linear_tile reads)
template <class O, int F, class Tile = QTile<O, F>>
void dequantize_panel(const uint8_t* panel, int64_t K, float* buf) {
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const Tile t(panel, b);
    for (int64_t kk = 0; kk < kQBlock; ++kk) {
      typename O::V w0, w1;
      t.at(kk, w0, w1);
      float* row = buf + (b * kQBlock + kk) * kPanel;
      O::store(row, w0);
      O::store(row + kLanes, w1);
    }
  }
}

// Column panels [panel_begin, panel_end) of y = x @ W^T for a packed quantized W. Up to one row tile,
// in-register dequantization (two panels at a time for one or two rows); more rows, each panel is
// dequantized once per row block into a buffer and the float32 tiles run over it. Same weights,
// same chains: the two routes give the same bits. Tile: where the weights are dequantized (QTile, or an
// instruction set's own tile giving the same values)
template <class O, int F, class Tile = QTile<O, F>>
void qlinear_panels(const float* x, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                    int64_t panel_begin, int64_t panel_end) {
  const int64_t panel_bytes = panel_bytes_of(F, K);
  const auto cols_of = [N](int64_t p) { return std::min(kPanel, N - p * kPanel); };
  if (M <= kRowTile) {
    std::vector<float> xt(K * kRowTile, 0.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xt[k * kRowTile + m] = x[m * K + k];
    for (int64_t p = panel_begin; p < panel_end;) {
      const uint8_t* panel = packed + p * panel_bytes;
      if (M <= 2 && p + 1 < panel_end) {
        const int64_t cols[2] = {cols_of(p), cols_of(p + 1)};
        qlinear_tile_rows<O, F, 2, Tile>(M, xt.data(), K, panel, panel_bytes, y + p * kPanel, N, cols);
        p += 2;
      } else {
        const int64_t cols[1] = {cols_of(p)};
        qlinear_tile_rows<O, F, 1, Tile>(M, xt.data(), K, panel, panel_bytes, y + p * kPanel, N, cols);
        p += 1;
      }
    }
    return;
  }
  std::vector<float> xt, wbuf(K * kPanel);
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    const int64_t tiles = interleave_rows(x, K, m0, m1, xt);
    for (int64_t p = panel_begin; p < panel_end; ++p) {
      dequantize_panel<O, F, Tile>(packed + p * panel_bytes, K, wbuf.data());
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m = m0 + t * kRowTile;
        linear_tile_rows<O, float>(std::min(kRowTile, m1 - m), xt.data() + t * K * kRowTile, K, wbuf.data(),
                                   y + m * N + p * kPanel, N, cols_of(p));
      }
    }
  }
}

}  // namespace nxk
