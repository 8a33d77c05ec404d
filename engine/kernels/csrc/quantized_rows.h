// Rows of a packed quantized weight as float32: an embedding lookup in a table held quantized (a tied
// head's, or a quantized token table), read in place from the tiles of quantized.h and qdot.h instead of
// dequantizing a whole panel per token. Every value is the one unpack_quantized gives: q * d (exact) for
// Q8, Q8S, Q3S and the IQ4 types, q * d + m (q * d exact, one rounding) for the 4-bit ones, in any layout.
#pragma once

#include <cstdint>

#include "qdot.h"

namespace nxk {

// out rows [begin, end) of [T, K] = rows ids[t] of a weight in base format F, dot layout or not
template <int F, bool Dot>
void quantized_rows_of(const uint8_t* packed, int64_t K, const int64_t* ids, float* out, int64_t begin, int64_t end) {
  const int64_t nb = K / kQBlock, panel_bytes = panel_bytes_of(F, K);
  for (int64_t t = begin; t < end; ++t) {
    const uint8_t* panel = packed + ids[t] / kPanel * panel_bytes;
    const int64_t c = ids[t] % kPanel;
    for (int64_t b = 0; b < nb; ++b) {
      float buf[kHeadFloats];
      const uint8_t* tile = block_head<F>(panel, b, buf);
      const uint8_t* quants = block_quants<F>(panel, b);
      const float d = tile_field<F>(tile, 0, c), second = tile_field<F>(tile, 1, c);
      float* row = out + t * K + b * kQBlock;
      for (int64_t k = 0; k < kQBlock; ++k) {
        const float q = static_cast<float>(Dot ? dot_quant<F>(quants, k, c) : tile_quant<F>(quants, k, c));
        if constexpr (!has_min(F) && !has_half_scales(F)) {  // Q8, IQ4, Q5Z, Q4Z
          row[k] = q * d;
        } else if constexpr (F == kQ2S) {  // q * d is exact: one rounding, as fma(q, d, m)
          const int h = k < kQBlock / 2 ? 0 : 1;
          row[k] = q * (h == 0 ? d : second) + tile_field<F>(tile, min_field(F, h), c);
        } else if constexpr (has_half_scales(F)) {
          row[k] = q * (k < kQBlock / 2 ? d : second);
        } else {
          row[k] = q * d + second;  // q * d is exact: one rounding, as fma(q, d, m)
        }
      }
    }
  }
}

// out [T, K] = rows ids[t] of the weight packed [P, K / (32 x group), group bytes] in ``format``, for t in [begin, end)
inline void quantized_rows(const uint8_t* packed, int64_t format, int64_t K, const int64_t* ids, float* out,
                           int64_t begin, int64_t end) {
  const bool dot = is_dot_format(format);
  switch (base_format(format)) {
#define NXK_ROWS_OF(f)                                                   \
  case f:                                                                \
    if (dot) {                                                           \
      quantized_rows_of<f, true>(packed, K, ids, out, begin, end);       \
    } else {                                                             \
      quantized_rows_of<f, false>(packed, K, ids, out, begin, end);      \
    }                                                                    \
    break;
    NXK_ROWS_OF(kQ8) NXK_ROWS_OF(kQ4) NXK_ROWS_OF(kQ4S) NXK_ROWS_OF(kQ8S) NXK_ROWS_OF(kQ5S) NXK_ROWS_OF(kI4) NXK_ROWS_OF(kI4S) NXK_ROWS_OF(kQ3S) NXK_ROWS_OF(kQ2S) NXK_ROWS_OF(kQ5) NXK_ROWS_OF(kQ5Z) NXK_ROWS_OF(kQ4Z)
#undef NXK_ROWS_OF
  }
}

}  // namespace nxk
