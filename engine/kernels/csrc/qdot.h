// Quantized linears with integer activations (llama.cpp's route): each row's inputs are quantized per
// block of 32 k to int8 (or int16) with one float scale, every block's dot product with a weight block
// is an exact integer sum, and a fixed float combine per block adds it to the output:
//
//   per row m, block b:  dx = max|x| / L,  qx[k] = round_even(x[k] * (1 / dx)) in [-L, L]
//                        L = 127 (int8) or 32767 (int16: 256 times finer, sums still exact in int32)
//                        s  = sum of qx over each half block (16 k)   (exact integers)
//   per output (m, n), blocks b = 0, 1, ... in order, acc from 0:
//     Q8, I4, I4S, Q5Z, Q4Z acc = fma(d * dx, float(sum_k q * qx), acc)          (one fma per scale)
//     Q8S, Q3S halves
//     Q2S halves       acc = fma(d * dx, float(sum_k q * qx), acc);  acc = fma(m, dx * float(s), acc) per half
//     Q4, Q4S, Q5S, Q5 acc = fma(d * dx, float(sum_k q * qx), acc);  acc = fma(m, dx * float(s), acc)
//
// The integer sums are exact however an instruction set forms them (VNNI, pairs of 16-bit products,
// scalar loops), the row's quantization reads the row alone, and the float operations per output are
// the ones above in that order: so every backend gives the same bits, and a row's output depends on
// the row alone (batch invariance by construction). The values differ from the float32 linear's (the
// activations are rounded to 8 bits); the bench measures how often the top token still agrees.
//
// The "dot" layouts are the quantized.h tiles with the quants regrouped for 4-byte dot products
// (scales unchanged, same bytes): k in quads of 4, quad j of column c at byte (j * 16 + c) * 4.
//   Q8D        8 quads x 16 columns x 4 bytes, each byte q ^ 0x80 (q + 128 as an unsigned byte)
//   Q4D, Q4SD  4 chunks x 16 columns x 4 bytes: quad j in the low nibbles of chunk j, quad j + 4 in
//              the high nibbles (0..15, unsigned)
//   Q8SD       the 6-bit u = q + 32: its low 4 bits as Q4D (256 bytes), then its high 2 bits in 2 chunks
//              x 16 columns x 4 bytes, quad 4h + t at bits 2t of chunk h; the sums are corrected by 32 * sum(qx)
//   Q5SD       the 5-bit u: its low 4 bits as Q4D (256 bytes), then its fifth bit in 16 columns x 4 bytes,
//              quad j at bit j
//   Q3SD       the 3-bit u = q + 4: its low 2 bits as Q8SD's high plane (128 bytes), then its third bit as
//              Q5SD's fifth; the sums are corrected by 4 * sum(qx)
//   Q2SD       the 2-bit quants as Q8SD's high plane
//   Q5D, Q5ZD, Q4ZD  as Q4D, Q5SD; Q5ZD's and Q4ZD's sums corrected by 16 and 8 * sum(qx)
//   I4D, I4SD  the nibbles as Q4D; the kernels look each up as its IQ4 value + 128 (unsigned), the sums
//              corrected by 128 * sum(qx) as Q8D's
// Format f + 4 multiplies int8 activations, f + 8 (the same bytes) int16 ones. Int16 activations are
// stored with each quad's middle two swapped (x0 x2 x1 x3): a weight quad's even bytes (k0, k2) and
// odd bytes (k1, k3), widened to 16 bits where they lie, then meet their inputs pair by pair.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "quantized.h"

namespace nxk {

constexpr int kDotFormats = kBaseFormats;  // format f + kDotFormats is format f in the dot layout
enum QDotFormat : int { kQ8D = kQ8 + kDotFormats, kQ4D, kQ4SD, kQ8SD, kQ5SD, kI4D, kI4SD, kQ3SD, kQ2SD, kQ5D, kQ5ZD, kQ4ZD };
enum QWideFormat : int { kQ8W = kQ8 + 2 * kDotFormats, kQ4W, kQ4SW, kQ8SW, kQ5SW, kI4W, kI4SW, kQ3SW, kQ2SW, kQ5W, kQ5ZW, kQ4ZW };  // the dot layout, int16 inputs
constexpr int kFormats = 3 * kBaseFormats;  // every format value: base, dot layout (int8, int16 inputs)
constexpr int64_t kQuads = kQBlock / 4;                 // 4-byte groups of k per block
constexpr int64_t kQuadRowBytes = kPanel * 4;          // one quad of 16 columns (64 bytes)

// Base formats whose dot kernels see each weight as a signed 8-bit value + 128 (unsigned bytes): Q8's
// stored bytes, the IQ4 types' looked-up values; their integer sums are corrected by 128 * sum(qx)
constexpr bool is_biased_byte(int64_t format) { return format % kBaseFormats == kQ8 || is_iq4(format); }

constexpr bool is_dot_format(int64_t format) { return format >= kDotFormats && format < kFormats; }
constexpr bool is_wide_format(int64_t format) { return format >= 2 * kDotFormats && format < kFormats; }
constexpr int base_format(int64_t format) { return static_cast<int>(format % kDotFormats); }

// A dot-layout panel unpacked for many rows (the SIMD dot kernels' prefill path): per block, its kQuads
// quads as unsigned weight bytes (the dot layout's order, 64 bytes a quad) and then its float32 scale
// fields, kPanel floats each: the scales (and the second half block's, or the mins) as the block's tile
// gives them, so a kernel reading them forms the same bits as one decoding the packed block.
template <int F>
constexpr int kUnpackedFields = F == kQ2S ? 4 : (has_half_scales(F) || has_min(F)) ? 2 : 1;
template <int F>
constexpr int64_t kUnpackedBlockBytes = kQuads * kQuadRowBytes + kUnpackedFields<F> * kPanel * 4;

// This thread's scratch for unpacked panels: ``bytes`` bytes, 64-byte aligned, kept for the next call.
// (Inline, so one definition is kept for every object using it: build.SOURCES' link order keeps the
// least demanding one; test_link_order.py checks it.)
inline uint8_t* unpack_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < bytes + 64) scratch.resize(bytes + 64);
  const uintptr_t start = reinterpret_cast<uintptr_t>(scratch.data());
  return scratch.data() + ((64 - start % 64) % 64);
}

// The quant of column c at k (0..31) of a tile's quants in the dot layout of base format F.
template <int F>
inline int32_t dot_quant(const uint8_t* quants, int64_t k, int64_t c) {
  const int64_t j = k / 4, i = k % 4;  // quad j, its input i
  if constexpr (F == kQ8) return static_cast<int8_t>(quants[(j * kPanel + c) * 4 + i] ^ 0x80);
  if constexpr (F == kQ2S) return (quants[((j / 4) * kPanel + c) * 4 + i] >> (2 * (j % 4))) & 0x03;
  if constexpr (F == kQ3S) {
    const int32_t two = (quants[((j / 4) * kPanel + c) * 4 + i] >> (2 * (j % 4))) & 0x03;
    const int32_t bit = (quants[kTwoBitPlane + c * 4 + i] >> j) & 0x01;
    return (two | (bit << 2)) - quant_offset(F);
  }
  const uint8_t byte = quants[((j % 4) * kPanel + c) * 4 + i];
  const int32_t low = j < 4 ? byte & 0x0F : byte >> 4;
  if constexpr (F == kQ8S) {
    const int32_t high = (quants[kLowPlane + ((j / 4) * kPanel + c) * 4 + i] >> (2 * (j % 4))) & 0x03;
    return (low | (high << 4)) - 32;
  }
  if constexpr (is_iq4(F)) return kIQ4Values[low];
  if constexpr (has_fifth_bit(F)) return (low | (((quants[kLowPlane + c * 4 + i] >> j) & 0x01) << 4)) - quant_offset(F);
  return low - quant_offset(F);
}

// A step's rows quantized (see the top of this file): q [M, K] int8 or int16, d [M, K / 32], s [M, K / 16].
template <class Q>
struct QActsOf {
  const Q* q;
  const float* d;
  const int32_t* s;
};
using QActs = QActsOf<int8_t>;
using QActs16 = QActsOf<int16_t>;

template <class Q>
constexpr float kQLimit = sizeof(Q) == 1 ? 127.0f : 32767.0f;

// where input i (0..3) of a quad is stored: int16 inputs as x0 x2 x1 x3 (see the top of this file)
template <class Q>
constexpr int64_t quad_slot(int64_t i) {
  return sizeof(Q) == 1 ? i : (i & 1) * 2 + (i >> 1);
}

constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (v + magic) - magic is v rounded to nearest, ties even

// Rows [row_begin, row_end) of x [M, K] quantized into a's buffers (K a multiple of 32). Scalar and
// static: one copy per translation unit, the same IEEE operations wherever it is compiled (|v| <= 32767
// here, so the magic-number rounding is exact round-to-nearest-even).
template <class Q>
static inline void quantize_rows(const float* x, int64_t K, Q* q, float* d, int32_t* s, int64_t row_begin,
                                 int64_t row_end) {
  constexpr float limit = kQLimit<Q>;
  const int64_t nb = K / kQBlock;
  for (int64_t m = row_begin; m < row_end; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQBlock;
      float amax = 0.0f;
      for (int64_t i = 0; i < kQBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float scale = amax / limit;
      const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
      Q* qb = q + m * K + b * kQBlock;
      int32_t half[2] = {0, 0};
      for (int64_t i = 0; i < kQBlock; ++i) {
        // NaN -> -limit (the block's max skipped it); an infinite max makes inverse 0, and inf * 0 NaN
        const float v = std::min(limit, std::max(-limit, xb[i] * inverse));
        const int r = static_cast<int>((v + kRoundMagic) - kRoundMagic);
        qb[(i & ~int64_t{3}) + quad_slot<Q>(i & 3)] = static_cast<Q>(r);
        half[i / (kQBlock / 2)] += r;
      }
      d[m * nb + b] = scale;
      s[(m * nb + b) * 2] = half[0];
      s[(m * nb + b) * 2 + 1] = half[1];
    }
}

// Column panels [panel_begin, panel_end) of y = x @ W^T, x given quantized, W in dot layout F + 4
// (or F + 8 with int16 inputs). The portable reference: one output at a time, scalar integer sums.
// (Templated on the table's vector struct only so that each instruction set's file keeps its own copy.)
template <class O, int F, class Q>
void qdot_panels(const QActsOf<Q>& a, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                 int64_t panel_begin, int64_t panel_end) {
  const int64_t nb = K / kQBlock, panel_bytes = panel_bytes_of(F, K);
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const int64_t cols = std::min(kPanel, N - p * kPanel);
    for (int64_t m = 0; m < M; ++m) {
      float acc[kPanel] = {};
      for (int64_t b = 0; b < nb; ++b) {
        float buf[kHeadFloats];
        const uint8_t* tile = block_head<F>(packed + p * panel_bytes, b, buf);
        const uint8_t* quants = block_quants<F>(packed + p * panel_bytes, b);
        const Q* xq = a.q + m * K + b * kQBlock;
        const float dx = a.d[m * nb + b];
        const int32_t* s = a.s + (m * nb + b) * 2;
        for (int64_t c = 0; c < cols; ++c) {
          int32_t half[2] = {0, 0};
          for (int64_t j = 0; j < kQuads; ++j)
            for (int64_t i = 0; i < 4; ++i)
              half[j / (kQuads / 2)] += dot_quant<F>(quants, j * 4 + i, c) * xq[j * 4 + quad_slot<Q>(i)];
          // Q4, Q4S, Q5S: d and m; Q8S, Q3S: the two halves' scales
          const float d0 = tile_field<F>(tile, 0, c), d1 = tile_field<F>(tile, 1, c);
          if constexpr (has_half_scales(F)) {
            for (int h = 0; h < 2; ++h) {
              acc[c] = std::fma((h == 0 ? d0 : d1) * dx, static_cast<float>(half[h]), acc[c]);
              if constexpr (has_min(F)) acc[c] = std::fma(tile_field<F>(tile, min_field(F, h), c), dx * static_cast<float>(s[h]), acc[c]);
            }
          } else {
            acc[c] = std::fma(d0 * dx, static_cast<float>(half[0] + half[1]), acc[c]);
            if constexpr (has_min(F)) acc[c] = std::fma(d1, dx * static_cast<float>(s[0] + s[1]), acc[c]);
          }
        }
      }
      std::copy(acc, acc + cols, y + m * N + p * kPanel);
    }
  }
}

}  // namespace nxk
