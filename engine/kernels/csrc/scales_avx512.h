// The K types' block scales formed with AVX-512 (quantized.h's block_head, 16 columns at once): the same
// exact float32 products as its scalar loop, stored into the caller's buffer as float32 d[16], m[16].
// Included by the files compiled for AVX-512 (after their target pragma, and after <cstring>); internal linkage.
#pragma once

#include <immintrin.h>

#include "quantized.h"

namespace nxk {

// -(x) for every lane, as the scalar negation: the sign bit flipped (0 - x would turn -0 into +0)
static inline __m512 negate16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
}

static inline __m512 half16_at(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Q4S, Q5S: d = D * sc, m = -(Dmin * mn); sc, mn = low 4 bits (the block tile's byte) | high 2 bits << 4
template <int F>
static inline void q4s_scales16(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(F);
  const int64_t j = b % kSuperBlocks;
  const __m128i high8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(super + 2 * kScaleBytes + j * (kPanel / 2)));
  const __m512i by_column = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(high8, high8));  // byte c % 8 in lane c
  const __m512i nibble_shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
  const __m512i high = _mm512_and_si512(_mm512_srlv_epi32(by_column, nibble_shift), _mm512_set1_epi32(0x0F));
  const __m512i low = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(super + kQ4SHead + j * tile_bytes(F))));
  const __m512i four = _mm512_set1_epi32(0x0F), three = _mm512_set1_epi32(0x03);
  const __m512i sc = _mm512_or_si512(_mm512_and_si512(low, four), _mm512_slli_epi32(_mm512_and_si512(high, three), 4));
  const __m512i mn = _mm512_or_si512(_mm512_srli_epi32(low, 4), _mm512_slli_epi32(_mm512_srli_epi32(high, 2), 4));
  _mm512_storeu_ps(out, _mm512_mul_ps(half16_at(super), _mm512_cvtepi32_ps(sc)));
  _mm512_storeu_ps(out + kPanel, negate16(_mm512_mul_ps(half16_at(super + kScaleBytes), _mm512_cvtepi32_ps(mn))));
}

// Q8S: the half blocks' scales D * sc (int8 sub-scales)
static inline void q8s_scales16(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ8S);
  const uint8_t* sc = super + kScaleBytes + (b % kSuperBlocks) * 2 * kPanel;
  const __m512 d = half16_at(super);
  for (int half = 0; half < 2; ++half) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + half * kPanel));
    _mm512_storeu_ps(out + half * kPanel, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))));
  }
}

// 16 columns' D * (sc - 32) into out (quantized.h's signed_six_bit_scales): the 6-bit sc from the
// kSixBitScales bytes at ``six``
static inline void signed_six_bit_scales16(const uint8_t* super, const uint8_t* six, float* out) {
  const __m128i low_bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(six));
  const __m512i by_column = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(low_bytes, low_bytes));  // byte c % 8 in lane c
  const __m512i nibble_shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
  const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(by_column, nibble_shift), _mm512_set1_epi32(0x0F));
  int32_t word;  // the 16 columns' high 2 bits, column c at bits 2c
  std::memcpy(&word, six + kPanel / 2, 4);
  const __m512i pair_shift = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i high = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), pair_shift), _mm512_set1_epi32(3));
  const __m512i sc = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), _mm512_set1_epi32(32));
  _mm512_storeu_ps(out, _mm512_mul_ps(half16_at(super), _mm512_cvtepi32_ps(sc)));
}

// I4S: d = D * (sc - 32), then 16 zeros
static inline void i4s_scales16(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kI4S);
  signed_six_bit_scales16(super, super + kScaleBytes + (b % kSuperBlocks) * kSixBitScales, out);
  _mm512_storeu_ps(out + kPanel, _mm512_setzero_ps());
}

// Q3S: the two sub-blocks' D * (sc - 32)
static inline void q3s_scales16(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ3S);
  const uint8_t* six = super + kScaleBytes + (b % kSuperBlocks) * 2 * kSixBitScales;
  signed_six_bit_scales16(super, six, out);
  signed_six_bit_scales16(super, six + kSixBitScales, out + kPanel);
}

// Q2S: the two sub-blocks' D * sc, then their mins -(Dmin * mn)
static inline void q2s_scales16(const uint8_t* panel, int64_t b, float* out) {
  const uint8_t* super = panel + (b / kSuperBlocks) * group_bytes(kQ2S);
  const uint8_t* subs = super + 2 * kScaleBytes + (b % kSuperBlocks) * 2 * kPanel;
  const __m512 d = half16_at(super), dmin = half16_at(super + kScaleBytes);
  for (int half = 0; half < 2; ++half) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(subs + half * kPanel)));
    const __m512i sc = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)), mn = _mm512_srli_epi32(bytes, 4);
    _mm512_storeu_ps(out + half * kPanel, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
    _mm512_storeu_ps(out + (2 + half) * kPanel, negate16(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn))));
  }
}

// block_head with the K types' scales formed 16 columns at once
template <int F>
static inline const uint8_t* block_head16(const uint8_t* panel, int64_t b, float* buf) {
  constexpr int f = F % kBaseFormats;
  if constexpr (has_formed_scales(f)) {
    if constexpr (has_k4_head(f)) q4s_scales16<f>(panel, b, buf);
    if constexpr (f == kQ8S) q8s_scales16(panel, b, buf);
    if constexpr (f == kI4S) i4s_scales16(panel, b, buf);
    if constexpr (f == kQ3S) q3s_scales16(panel, b, buf);
    if constexpr (f == kQ2S) q2s_scales16(panel, b, buf);
    return reinterpret_cast<const uint8_t*>(buf);
  } else {
    return tile_at<F>(panel, b);
  }
}

}  // namespace nxk
