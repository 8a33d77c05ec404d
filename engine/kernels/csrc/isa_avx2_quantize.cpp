// qdot.h's quantize_rows in 8 lanes, for the AVX2 table (the AVX-512 table replaces it with its own
// 16 lanes): the same IEEE operations per input as the scalar loop (|x|, max, x * inverse, clamp,
// (v + 1.5 * 2^23) - 1.5 * 2^23), so the same integers and scales, NaN and infinities included:
//   - the block's max of |x| skips NaN lanes as std::max(acc, nan) does (vmaxps returns its second
//     operand, the running max, when the first is NaN); a max is exact in any order;
//   - the clamp sends NaN to -L as std::min(L, std::max(-L, nan)) does (vmaxps(nan, -L) is -L);
//   - the rounded values are integers within [-L, L], so the saturating packs to 16 and 8 bits are exact;
//   - the half-block sums are exact integer sums.
// On an AVX2-only CPU the scalar loop took ~5% of a 64-request bench with the default mixed activations.
#if defined(__x86_64__) || defined(_M_X64)
#include <cstdint>

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"

namespace nxk {
namespace {

// 8 quantized inputs (lanes in k order, integers within [-L, L]) stored at q: int8 as they are, int16
// with each quad's middle two swapped (qdot.h: x0 x2 x1 x3)
inline void store_quants(int8_t* q, __m256i r) {
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(words, words));
}
inline void store_quants(int16_t* q, __m256i r) {
  const __m256i swapped = _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7));
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(swapped), _mm256_extracti128_si256(swapped, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), words);
}

// the exact sum of 8 int32 lanes
inline int32_t lane_sum(__m256i r) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}

// the largest of 8 lanes, none NaN (exact in any order)
inline float lane_max(__m256 a) {
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
}

template <class Q>
void quantize_rows_avx2(const float* x, int64_t K, Q* q, float* d, int32_t* s, int64_t row_begin, int64_t row_end) {
  constexpr float limit = kQLimit<Q>;
  constexpr int kVectors = kQBlock / 8;  // four 8-lane vectors per block, two per half block
  const int64_t nb = K / kQBlock;
  const __m256 magic = _mm256_set1_ps(kRoundMagic), hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t m = row_begin; m < row_end; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQBlock;
      __m256 xs[kVectors];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < kVectors; ++i) {
        xs[i] = _mm256_loadu_ps(xb + i * 8);
        amax = _mm256_max_ps(_mm256_and_ps(xs[i], abs_mask), amax);  // a NaN lane keeps the running max
      }
      const float scale = lane_max(amax) / limit;
      const __m256 inverse = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
      Q* qb = q + m * K + b * kQBlock;
      __m256i half[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int i = 0; i < kVectors; ++i) {
        const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(xs[i], inverse), lo), hi);
        const __m256i r = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(v, magic), magic));
        store_quants(qb + i * 8, r);
        half[i / (kVectors / 2)] = _mm256_add_epi32(half[i / (kVectors / 2)], r);
      }
      d[m * nb + b] = scale;
      s[(m * nb + b) * 2] = lane_sum(half[0]);
      s[(m * nb + b) * 2 + 1] = lane_sum(half[1]);
    }
}

}  // namespace

void use_avx2_quantizers(KernelTable& t) {
  t.quantize_i8 = &quantize_rows_avx2<int8_t>;
  t.quantize_i16 = &quantize_rows_avx2<int16_t>;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
void use_avx2_quantizers(KernelTable&) {}
}  // namespace nxk
#endif
