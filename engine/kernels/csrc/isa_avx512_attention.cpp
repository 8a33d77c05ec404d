// Attention for the AVX-512 table: kernels.h's attention_items over the AVX2 vector struct (avx2_vec.h),
// compiled here (32 registers), with its two passes over the keys 16 lanes wide. Every lane still runs
// the 8-lane kernel's chain (each score's fma chain over head_dim, then hsum8; each output dimension's
// fma chain over the keys, then / total), so the AVX2 and generic tables' bits; the cross-instruction-
// set tests compare them. Half the fma and widening instructions of the 8-lane passes.
#if defined(__x86_64__) || defined(_M_X64)
#include <algorithm>
#include <cstdint>

#include "vec.h"

#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"
#include "avx2_vec.h"

namespace nxk {
namespace {

inline __m512 load_values(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_values(const uint16_t* p) {  // bfloat16, exact
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load_values(const Half* p) {  // float16, exact
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

constexpr int kWideValueAccumulators = 24;  // HP heads x N of the 32 registers (4 hold weights and values)

// kernels.h's weighted_values over 16-lane vectors: lane i of vector t is output dimension 16 t + i, and
// its chain (fma of each key's weight and value in key order, then / total) is the 8-lane kernel's.
template <class C, int HP, int N>
void wide_values(const float* p, int64_t p_stride, const int64_t* key_at, int64_t L, const C* v, const float* total,
                 float* out, int64_t out_stride) {
  __m512 acc[HP][N];
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) acc[h][t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < L; ++j) {
    const C* vp = v + key_at[j];
    __m512 pj[HP];
    for (int h = 0; h < HP; ++h) pj[h] = _mm512_set1_ps(p[h * p_stride + j]);
    for (int t = 0; t < N; ++t) {
      const __m512 vt = load_values(vp + t * kPanel);
      for (int h = 0; h < HP; ++h) acc[h][t] = _mm512_fmadd_ps(pj[h], vt, acc[h][t]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t)
      _mm512_storeu_ps(out + h * out_stride + t * kPanel, _mm512_div_ps(acc[h][t], _mm512_set1_ps(total[h])));
}

// wide_values for two rows of one request (a prefill chunk's neighbours: the second sees the first's
// L0 keys and one more): each V vector loaded once for both rows' HP heads over the shared keys, then
// the second row's last key alone; each row's chains are wide_values' for that row alone
template <class C, int HP, int N>
void wide_values_pair(const float* p0, int64_t p0_stride, const float* p1, int64_t p1_stride, const int64_t* key_at,
                      int64_t L0, const C* v, const float* total0, const float* total1, float* out0, float* out1,
                      int64_t out_stride) {
  __m512 acc0[HP][N], acc1[HP][N];
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) acc0[h][t] = acc1[h][t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < L0; ++j) {
    const C* vp = v + key_at[j];
    __m512 pj0[HP], pj1[HP];
    for (int h = 0; h < HP; ++h) {
      pj0[h] = _mm512_set1_ps(p0[h * p0_stride + j]);
      pj1[h] = _mm512_set1_ps(p1[h * p1_stride + j]);
    }
    for (int t = 0; t < N; ++t) {
      const __m512 vt = load_values(vp + t * kPanel);
      for (int h = 0; h < HP; ++h) {
        acc0[h][t] = _mm512_fmadd_ps(pj0[h], vt, acc0[h][t]);
        acc1[h][t] = _mm512_fmadd_ps(pj1[h], vt, acc1[h][t]);
      }
    }
  }
  const C* vp = v + key_at[L0];  // the second row's own last key
  for (int t = 0; t < N; ++t) {
    const __m512 vt = load_values(vp + t * kPanel);
    for (int h = 0; h < HP; ++h) acc1[h][t] = _mm512_fmadd_ps(_mm512_set1_ps(p1[h * p1_stride + L0]), vt, acc1[h][t]);
  }
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) {
      _mm512_storeu_ps(out0 + h * out_stride + t * kPanel, _mm512_div_ps(acc0[h][t], _mm512_set1_ps(total0[h])));
      _mm512_storeu_ps(out1 + h * out_stride + t * kPanel, _mm512_div_ps(acc1[h][t], _mm512_set1_ps(total1[h])));
    }
}

// Keys u and u + 4's 8-lane vectors at the same offset, side by side in one 16-lane register, widened
// exactly as the 8-lane loads do
inline __m512 key_pair(const float* a, const float* b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a))),
                                             _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
inline __m256i halves_pair(const void* a, const void* b) {  // 8 16-bit values from each
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(a))),
                                 _mm_loadu_si128(static_cast<const __m128i*>(b)), 1);
}
inline __m512 key_pair(const uint16_t* a, const uint16_t* b) {  // bfloat16
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves_pair(a, b)), 16));
}
inline __m512 key_pair(const Half* a, const Half* b) { return _mm512_cvtph_ps(halves_pair(a, b)); }

// kernels.h's passes 16 lanes wide (the AVX2 kernel's chains, so its bits):
// - scores: kernels.h's key_dots with keys u and u + 4 side by side in one register (lanes 0-7 key u's
//   chain, lanes 8-15 key u + 4's, each over head_dim in the same order): half the fma and widening
//   instructions; the halves are handed back as the eight 8-lane vectors hsum8 reduces;
// - values: lane i of vector t is output dimension 16 t + i; a head_dim that is not a multiple of 16
//   takes the 8-lane pass.
struct SixteenLanePasses {
  static constexpr bool kPairRows = true;  // two rows' accumulators fit the 32 registers

  template <class O, class C, int HG>
  static void scores(const float* q, int64_t d, const C* const* kp, __m256 (*dot)[kLanes]) {
    constexpr int kPairs = kLanes / 2;
    __m512 acc[HG][kPairs];
    for (int h = 0; h < HG; ++h)
      for (int i = 0; i < kPairs; ++i) acc[h][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += kLanes) {
      __m512 key[kPairs];
      for (int i = 0; i < kPairs; ++i) key[i] = key_pair(kp[i] + c, kp[i + kPairs] + c);
      for (int h = 0; h < HG; ++h) {  // head h's 8 query values at c, in both halves (bits copied)
        const __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + h * d + c))));
        for (int i = 0; i < kPairs; ++i) acc[h][i] = _mm512_fmadd_ps(qv, key[i], acc[h][i]);
      }
    }
    for (int h = 0; h < HG; ++h)
      for (int i = 0; i < kPairs; ++i) {
        dot[h][i] = _mm512_castps512_ps256(acc[h][i]);
        dot[h][i + kPairs] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[h][i]), 1));
      }
  }

  // scores for two rows' HG heads (q0, q1) over the same eight keys: each key pair loaded and widened
  // once for both; each row's dots those of scores() for that row
  template <class O, class C, int HG>
  static void scores_pair(const float* q0, const float* q1, int64_t d, const C* const* kp, __m256 (*dot0)[kLanes],
                          __m256 (*dot1)[kLanes]) {
    constexpr int kPairs = kLanes / 2;
    __m512 acc0[HG][kPairs], acc1[HG][kPairs];
    for (int h = 0; h < HG; ++h)
      for (int i = 0; i < kPairs; ++i) acc0[h][i] = acc1[h][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += kLanes) {
      __m512 key[kPairs];
      for (int i = 0; i < kPairs; ++i) key[i] = key_pair(kp[i] + c, kp[i + kPairs] + c);
      for (int h = 0; h < HG; ++h) {
        const __m512 qv0 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q0 + h * d + c))));
        const __m512 qv1 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q1 + h * d + c))));
        for (int i = 0; i < kPairs; ++i) {
          acc0[h][i] = _mm512_fmadd_ps(qv0, key[i], acc0[h][i]);
          acc1[h][i] = _mm512_fmadd_ps(qv1, key[i], acc1[h][i]);
        }
      }
    }
    for (int h = 0; h < HG; ++h)
      for (int i = 0; i < kPairs; ++i) {
        dot0[h][i] = _mm512_castps512_ps256(acc0[h][i]);
        dot0[h][i + kPairs] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc0[h][i]), 1));
        dot1[h][i] = _mm512_castps512_ps256(acc1[h][i]);
        dot1[h][i + kPairs] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc1[h][i]), 1));
      }
  }

  // values for two rows of one request, the second seeing the first's L0 keys and one more: value_pieces
  // of half the accumulators (the pair holds both rows'), each V load shared; a head_dim that is not a
  // multiple of 16 runs each row's values() alone
  template <class O, class C>
  static void values_pair(int64_t group, int64_t d, const float* p0, int64_t p0_stride, const float* p1,
                          int64_t p1_stride, const int64_t* key_at, int64_t L0, const C* v_cache, const float* totals0,
                          const float* totals1, float* out0, float* out1) {
    if (d % kPanel != 0) {
      values<O, C>(group, d, p0, p0_stride, key_at, L0, v_cache, totals0, out0);
      values<O, C>(group, d, p1, p1_stride, key_at, L0 + 1, v_cache, totals1, out1);
      return;
    }
    value_pieces<kWideValueAccumulators / 2>(
        kPanel, group, d, p0, p0_stride, v_cache, totals0, out0,
        [&](auto heads, auto vectors, const float* ph, const C* v, const float* tot, float* o) {
          constexpr int HP = decltype(heads)::value, N = decltype(vectors)::value;
          const int64_t h0 = tot - totals0;  // the piece's first head; its dimensions are o's offset in out0
          wide_values_pair<C, HP, N>(ph, p0_stride, p1 + h0 * p1_stride, p1_stride, key_at, L0, v, tot, totals1 + h0, o,
                                     out1 + (o - out0), d);
        });
  }

  template <class O, class C>
  static void values(int64_t group, int64_t d, const float* p, int64_t p_stride, const int64_t* key_at, int64_t L,
                     const C* v_cache, const float* totals, float* out) {
    if (d % kPanel != 0) return EightLanePasses::values<O, C>(group, d, p, p_stride, key_at, L, v_cache, totals, out);
    value_pieces<kWideValueAccumulators>(
        kPanel, group, d, p, p_stride, v_cache, totals, out,
        [&](auto heads, auto vectors, const float* ph, const C* v, const float* tot, float* o) {
          constexpr int HP = decltype(heads)::value, N = decltype(vectors)::value;
          wide_values<C, HP, N>(ph, p_stride, key_at, L, v, tot, o, d);
        });
  }
};

}  // namespace

void use_avx512_attention(KernelTable& t) {
  t.attention_f32 = &attention_items<Avx2Vec, float, float, SixteenLanePasses>;
  t.attention_bf16 = &attention_items<Avx2Vec, uint16_t, uint16_t, SixteenLanePasses>;
  t.attention_f32_f16 = &attention_items<Avx2Vec, float, Half, SixteenLanePasses>;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
void use_avx512_attention(KernelTable&) {}
}  // namespace nxk
#endif
