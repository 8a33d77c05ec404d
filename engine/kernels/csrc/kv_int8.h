// The int8 KV cache: each token's head vector of d values is held as groups of kKvGroup values (the last
// group shorter where d is not a multiple of it), each group one float16 scale and its values as int8:
//   s = f16(min(amax / 127, 65504))      amax: the group's largest |x| (exact); rounded to nearest even
//   q = clamp(round_half_even(x / s), -127, 127), 0 where s is 0
// A value reads back as q * s: 8 significant bits times 11, exact in float32, so attention over an int8
// cache equals attention over a float32 cache holding the values q * s, bit for bit, on every build. A
// token's scales are its own: they never depend on what else its block holds, the chunking or the batch.
// engine/kv/int8.py quantizes the same way in torch (the tests compare the two).
//
// Scales are laid out as the cache they scale: V (and K held by row) [blocks, kv_heads, block, groups];
// K held by dimension (cache_layout.h) [blocks, kv_heads, groups, block], a block's keys side by side.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec.h"

namespace nxk {

constexpr int64_t kKvGroup = 32;  // values per scale

inline int64_t kv_groups(int64_t d) { return (d + kKvGroup - 1) / kKvGroup; }

// The scale of value c of the row whose first value sits at `row_at` (by row: a row's values side by side)
inline int64_t row_scale_at(int64_t row_at, int64_t d, int64_t c) { return row_at / d * kv_groups(d) + c / kKvGroup; }

// The scale of value c of the key at `k_at` held by dimension (k_at: its head block's start plus its
// offset in the block, the offset of its value 0)
inline int64_t column_scale_at(int64_t k_at, int64_t d, int64_t block, int64_t c) {
  const int64_t offset = k_at % block;  // head blocks start at multiples of block * d
  return (k_at - offset) / d * kv_groups(d) + c / kKvGroup * block + offset;
}

// x[0, d) as int8 values q and kv_groups(d) scales (the header's rule)
inline void quantize_kv_row(const float* x, int64_t d, int8_t* q, Half* scales) {
  for (int64_t c0 = 0, g = 0; c0 < d; c0 += kKvGroup, ++g) {
    const int64_t end = std::min(d, c0 + kKvGroup);
    float amax = 0.0f;
    for (int64_t c = c0; c < end; ++c) amax = std::max(amax, std::fabs(x[c]));
    scales[g].bits = float_to_f16(std::min(amax / 127.0f, 65504.0f));
    const float s = f16_to_float(scales[g].bits);
    for (int64_t c = c0; c < end; ++c) {
      const float r = s == 0.0f ? 0.0f : std::nearbyint(x[c] / s);
      q[c] = static_cast<int8_t>(r >= 127.0f ? 127.0f : r <= -127.0f ? -127.0f : r == r ? r : 0.0f);
    }
  }
}

// out[0, d) = one row's values q * s (d a multiple of kLanes; a vector never straddles two groups)
template <class O>
void dequantize_kv_row(const int8_t* q, const Half* scales, int64_t d, float* out) {
  for (int64_t c = 0; c < d; c += kLanes)
    O::store(out + c, O::mul(O::load_i8(q + c), O::set1(to_float(scales[c / kKvGroup]))));
}

// kt[c * stride + i] = key i's value c as q * s (0 where k_at[i] < 0), i < n: transpose()'s job
// (attention.h) for an int8 cache, K by row (key i's values at k_at[i] + c) or by dimension (at
// k_at[i] + c * block; whole vectors of one block's keys are read kLanes at a time)
template <class O>
void dequantize_keys(const int8_t* cache, const Half* scales, const int64_t* k_at, int64_t n, int64_t d,
                     int64_t block, bool by_dimension, float* kt, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) {
    if (by_dimension && i % kLanes == 0 && i + kLanes <= n && k_at[i] >= 0 &&
        k_at[i + kLanes - 1] == k_at[i] + kLanes - 1) {
      for (int64_t c0 = 0; c0 < d; c0 += kKvGroup) {
        const auto s = O::load(scales + column_scale_at(k_at[i], d, block, c0));  // the kLanes keys' scales
        for (int64_t c = c0; c < std::min(d, c0 + kKvGroup); ++c)
          O::store(kt + c * stride + i, O::mul(O::load_i8(cache + k_at[i] + c * block), s));
      }
      i += kLanes - 1;
      continue;
    }
    for (int64_t c = 0; c < d; ++c) {
      if (k_at[i] < 0) {
        kt[c * stride + i] = 0.0f;
        continue;
      }
      const int64_t at = by_dimension ? k_at[i] + c * block : k_at[i] + c;
      const int64_t scale = by_dimension ? column_scale_at(k_at[i], d, block, c) : row_scale_at(k_at[i], d, c);
      kt[c * stride + i] = static_cast<float>(cache[at]) * to_float(scales[scale]);
    }
  }
}

}  // namespace nxk
