// qdot.h's quantize_rows in 16 lanes, for the AVX-512 table: the same IEEE operations per input as the
// scalar loop (|x|, max, x * inverse, clamp, (v + 1.5 * 2^23) - 1.5 * 2^23), in lanes instead of one
// at a time, so the same integers and scales, NaN and infinities included:
//   - the block's max of |x| skips NaN lanes as std::max(acc, nan) does (vmaxps returns its second
//     operand, the running max, when the first is NaN); a max is exact in any order;
//   - the clamp sends NaN to -L as std::min(L, std::max(-L, nan)) does (vmaxps(nan, -L) is -L);
//   - the half-block sums are exact integer sums.
// The cross-instruction-set tests compare the linears' outputs with the scalar build's bit for bit.
#if defined(__x86_64__) || defined(_M_X64)
#include <cstdint>

#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"

namespace nxk {
namespace {

// 16 quantized inputs (lanes in k order) stored at q: int8 as they are, int16 with each quad's middle
// two swapped (qdot.h: x0 x2 x1 x3)
inline void store_quants(int8_t* q, __m512i r) { _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(r)); }
inline void store_quants(int16_t* q, __m512i r) {
  const __m512i slots = _mm512_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_cvtepi32_epi16(_mm512_permutexvar_epi32(slots, r)));
}

template <class Q>
void quantize_rows_avx512(const float* x, int64_t K, Q* q, float* d, int32_t* s, int64_t row_begin, int64_t row_end) {
  constexpr float limit = kQLimit<Q>;
  const int64_t nb = K / kQBlock;
  const __m512 magic = _mm512_set1_ps(kRoundMagic), hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  for (int64_t m = row_begin; m < row_end; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQBlock;
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + kQBlock / 2);
      const __m512 a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask));
      const __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), abs_mask));
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a1, _mm512_max_ps(a0, _mm512_setzero_ps())));
      const float scale = amax / limit;
      const __m512 inverse = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
      Q* qb = q + m * K + b * kQBlock;
      int32_t half[2];
      const __m512 xs[2] = {x0, x1};
      for (int h = 0; h < 2; ++h) {
        const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(xs[h], inverse), lo), hi);
        const __m512i r = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, magic), magic));
        store_quants(qb + h * kQBlock / 2, r);
        half[h] = _mm512_reduce_add_epi32(r);
      }
      d[m * nb + b] = scale;
      s[(m * nb + b) * 2] = half[0];
      s[(m * nb + b) * 2 + 1] = half[1];
    }
}

}  // namespace

void use_avx512_quantizers(KernelTable& t) {
  t.quantize_i8 = &quantize_rows_avx512<int8_t>;
  t.quantize_i16 = &quantize_rows_avx512<int16_t>;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
void use_avx512_quantizers(KernelTable&) {}
}  // namespace nxk
#endif
