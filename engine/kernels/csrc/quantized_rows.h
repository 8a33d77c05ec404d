// Rows of a packed quantized weight as float32: an embedding lookup in a table held quantized (a tied
// head's, or a quantized token table), read in place from the tiles of quantized.h and qdot.h instead of
// dequantizing a whole panel per token. Every value is the one unpack_quantized gives: q * d (exact) for
// the Q8 formats, q * d + m (q * d exact, one rounding) for the Q4 ones, in any layout.
#pragma once

#include <cstdint>

#include "qdot.h"

namespace nxk {

// quant of column c (0..15) at k (0..31) of one tile's quants, in base format ``base`` (quantized.h's
// layout, or qdot.h's dot layout when ``dot``)
inline int32_t tile_quant(const uint8_t* quants, int base, bool dot, int64_t k, int64_t c) {
  const bool bytes = base == kQ8 || base == kQ8S;
  if (dot) {
    const int64_t j = k / 4, i = k % 4;  // quad j, its input i
    if (bytes) return static_cast<int8_t>(quants[(j * kPanel + c) * 4 + i] ^ 0x80);
    const uint8_t byte = quants[((j % 4) * kPanel + c) * 4 + i];
    return j < 4 ? byte & 0x0F : byte >> 4;
  }
  if (bytes) return reinterpret_cast<const int8_t*>(quants)[k * kPanel + c];
  const uint8_t byte = quants[k * (kPanel / 2) + c % 8];
  return c < 8 ? byte & 0x0F : byte >> 4;
}

// a tile's scale (which = 0) or its second field (which = 1: Q4's min, Q8S's second half-block scale)
inline float tile_scale(const uint8_t* tile, int base, int which, int64_t c) {
  if (base == kQ4S || base == kQ8S) return reinterpret_cast<const float*>(tile)[which * kPanel + c];
  return f16_to_float(reinterpret_cast<const uint16_t*>(tile)[which * kPanel + c]);
}

// out [T, K] = rows ids[t] of the weight packed [P, K / 32, tile bytes] in ``format``, for t in [begin, end)
inline void quantized_rows(const uint8_t* packed, int64_t format, int64_t K, const int64_t* ids, float* out,
                           int64_t begin, int64_t end) {
  const int base = base_format(format);
  const bool dot = is_dot_format(format);
  const int64_t nb = K / kQBlock, tb = tile_bytes(format);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t panel = ids[t] / kPanel, c = ids[t] % kPanel;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* tile = packed + (panel * nb + b) * tb;
      const uint8_t* quants = tile + scale_bytes(base);
      const float d = tile_scale(tile, base, 0, c);
      const float second = base == kQ8 ? 0.0f : tile_scale(tile, base, 1, c);
      float* row = out + t * K + b * kQBlock;
      for (int64_t k = 0; k < kQBlock; ++k) {
        const float q = static_cast<float>(tile_quant(quants, base, dot, k, c));
        if (base == kQ8) {
          row[k] = q * d;
        } else if (base == kQ8S) {
          row[k] = q * (k < kQBlock / 2 ? d : second);
        } else {
          row[k] = q * d + second;  // q * d is exact: one rounding, as fma(q, d, m)
        }
      }
    }
  }
}

}  // namespace nxk
