// The eight-lane float vector struct over AVX2 + FMA + F16C intrinsics (vec.h's contract), for the files
// compiled for those instructions (isa_avx2.cpp; isa_avx512.cpp, whose attention is this code with wider
// value passes). Include it after the file's target pragma and <immintrin.h>. It sits in an unnamed
// namespace, so each file keeps its own copy, compiled for its own target: a copy compiled with AVX-512
// is never linked into the AVX2 table.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "vec.h"

namespace nxk {
namespace {

struct Avx2Vec {
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load(const Half* p) { return load_f16(reinterpret_cast<const uint16_t*>(p)); }
  static V load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void load_nibbles(const uint8_t* p, V& lo, V& hi) {
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(wide, _mm256_set1_epi32(0x0F)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(wide, 4));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store(Half* p, V v) {  // rounded to nearest even, as float_to_f16
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }  // a > b ? a : b, as GenericVec
  static V min(V a, V b) { return _mm256_min_ps(a, b); }  // a < b ? a : b, as GenericVec
  static V round_even(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V scale_pow2(V a, V n) {
    const __m256i shift = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(a), shift));
  }
  static V zero_below(V a, V x, float bound) {
    return _mm256_blendv_ps(a, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(bound), _CMP_LT_OQ));
  }
  static float hmax(V a) {  // exact whatever the order
    alignas(32) float l[kLanes];
    _mm256_store_ps(l, a);
    float m = l[0];
    for (int i = 1; i < kLanes; ++i) m = l[i] > m ? l[i] : m;
    return m;
  }
  static float hsum(V a) {  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
  // lane u = hsum(a[u]), the same additions in the same order, eight sums transposed at once
  static V hsum8(const V* a) {
    V q[4];  // q[u] = [s0..s3 of a[u] | s0..s3 of a[u + 4]], s_i = l_i + l_(i+4)
    for (int u = 0; u < 4; ++u)
      q[u] = _mm256_add_ps(_mm256_permute2f128_ps(a[u], a[u + 4], 0x20), _mm256_permute2f128_ps(a[u], a[u + 4], 0x31));
    // [s0 + s2, s1 + s3] of keys (0, 1 | 4, 5) and (2, 3 | 6, 7)
    const V r01 = _mm256_add_ps(_mm256_shuffle_ps(q[0], q[1], 0x44), _mm256_shuffle_ps(q[0], q[1], 0xEE));
    const V r23 = _mm256_add_ps(_mm256_shuffle_ps(q[2], q[3], 0x44), _mm256_shuffle_ps(q[2], q[3], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(r01, r23, 0x88), _mm256_shuffle_ps(r01, r23, 0xDD));
  }
};

}  // namespace
}  // namespace nxk
