// RoPE (rotate-half) on a step's query and key heads, and the step's keys and values written to the
// paged cache, over a vector struct O (vec.h), row by row.
//
// Elementwise: each output is two products and one sum or difference, each rounded once, as the
// layer-by-layer path's x * cos + rotate_half(x) * sin computes it (rotate_half negates exactly, and
// a + (-b) is a - b), so the lanes, the scalar loop and every table give the same bits. A float16 cache
// stores each value rounded to nearest even (vec.h float_to_f16, F16C's rounding); an int8 cache each
// row's groups of values with their scales (kv_int8.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "kv_int8.h"
#include "vec.h"

namespace nxk {

// One step's rows for rope_rows; C: the cache's element type (float, Half or int8_t)
template <class C>
struct RopeRows {
  const float* qk;        // [N, qk_stride]: each row's query heads, then its key heads (from heads * d)
  int64_t qk_stride;
  const float* v;         // [N, v_stride]: each row's value heads
  int64_t v_stride;
  const float* cos;       // [N, d]
  const float* sin;       // [N, d]
  const int64_t* slots;   // [N]: each row's cache slot (block * block size + offset)
  int64_t heads, kv_heads, d, block;
  float* q_out;           // [N, heads, d]: the rotated queries
  C* k_cache;             // [blocks, kv_heads, block, d], or [blocks, kv_heads, d, block] by dimension
  C* v_cache;             // [blocks, kv_heads, block, d]
  bool keys_by_dimension = false;  // the K cache's layout (cache_layout.h)
  Half* k_scales = nullptr;        // an int8 cache's scales (kv_int8.h), laid out as K
  Half* v_scales = nullptr;        //   and as V
};

// out[i] = x[i] cos[i] - x[i + d/2] sin[i] for i < d/2, x[i] cos[i] + x[i - d/2] sin[i] after; in lanes
// when half a head is whole vectors
template <class O>
void rotate_half(const float* x, const float* cos, const float* sin, int64_t d, float* out) {
  const int64_t half = d / 2;
  if (half % kLanes == 0) {
    for (int64_t i = 0; i < half; i += kLanes) {
      const auto lo = O::load(x + i), hi = O::load(x + half + i);
      O::store(out + i, O::sub(O::mul(lo, O::load(cos + i)), O::mul(hi, O::load(sin + i))));
      O::store(out + half + i, O::add(O::mul(hi, O::load(cos + half + i)), O::mul(lo, O::load(sin + half + i))));
    }
    return;
  }
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] - x[i + half] * sin[i];
  for (int64_t i = half; i < d; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

// d float32 values into a cache row: as they are, or rounded to float16
template <class O>
void store_cache_row(float* dst, const float* src, int64_t d) {
  std::memcpy(dst, src, d * sizeof(float));
}
template <class O>
void store_cache_row(Half* dst, const float* src, int64_t d) {
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) O::store(dst + i, O::load(src + i));
  for (; i < d; ++i) dst[i].bits = float_to_f16(src[i]);
}

// A rotated key's d values into an int8 K cache with their scales, at `offset` of the head block starting at
// head_block (by dimension: value c at head_block + c * block + offset)
inline void store_int8_key(const RopeRows<int8_t>& a, const float* key, int64_t head_block, int64_t offset) {
  const int64_t d = a.d, at = head_block + offset * d;
  int8_t q[kMaxHeadDim];
  Half scales[kMaxHeadDim / kKvGroup + 1];
  quantize_kv_row(key, d, q, scales);
  if (!a.keys_by_dimension) {
    std::memcpy(a.k_cache + at, q, d);
    std::memcpy(a.k_scales + row_scale_at(at, d, 0), scales, kv_groups(d) * sizeof(Half));
    return;
  }
  for (int64_t c = 0; c < d; ++c) a.k_cache[head_block + c * a.block + offset] = q[c];
  for (int64_t c = 0; c < d; c += kKvGroup) a.k_scales[column_scale_at(head_block + offset, d, a.block, c)] = scales[c / kKvGroup];
}

// rows [begin, end): the query heads rotated into q_out; each KV head's key rotated and stored, with its
// value, at the row's slot (each row writes its own slot, so rows may go to any thread)
template <class O, class C>
void rope_rows(const RopeRows<C>& a, int64_t begin, int64_t end) {
  const int64_t d = a.d;
  float key[kMaxHeadDim];
  for (int64_t r = begin; r < end; ++r) {
    const float* src = a.qk + r * a.qk_stride;
    const float* cos = a.cos + r * d;
    const float* sin = a.sin + r * d;
    for (int64_t h = 0; h < a.heads; ++h) rotate_half<O>(src + h * d, cos, sin, d, a.q_out + (r * a.heads + h) * d);
    const int64_t block = a.slots[r] / a.block, offset = a.slots[r] % a.block;
    for (int64_t g = 0; g < a.kv_heads; ++g) {
      const int64_t head_block = (block * a.kv_heads + g) * a.block * d, at = head_block + offset * d;
      rotate_half<O>(src + (a.heads + g) * d, cos, sin, d, key);
      const float* value = a.v + r * a.v_stride + g * d;
      if constexpr (std::is_same_v<C, int8_t>) {
        store_int8_key(a, key, head_block, offset);
        quantize_kv_row(value, d, a.v_cache + at, a.v_scales + row_scale_at(at, d, 0));
      } else {
        if (a.keys_by_dimension) {  // value c at head_block + c * block + offset, each rounded as by row
          C row[kMaxHeadDim];
          store_cache_row<O>(row, key, d);
          for (int64_t c = 0; c < d; ++c) a.k_cache[head_block + c * a.block + offset] = row[c];
        } else {
          store_cache_row<O>(a.k_cache + at, key, d);
        }
        store_cache_row<O>(a.v_cache + at, value, d);
      }
    }
  }
}

}  // namespace nxk
