// Attention for the AVX-512 table: attention.h's algorithm over the AVX2 vector struct (avx2_vec.h), its
// three span passes 16 lanes wide: keys transposed 16 by 16 in registers, the scores of 16 keys per
// vector, the values of 16 dimensions per vector. Every lane runs the chain the 8-lane passes run (one fma
// chain per score over head_dim, one per output dimension over the keys), so the bits are the AVX2 and
// generic tables'; the cross-instruction-set tests compare them.
#if defined(__x86_64__) || defined(_M_X64)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "vec.h"

#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"
#include "avx2_vec.h"

namespace nxk {
namespace {

constexpr int64_t kWide = 16;  // lanes of a 512-bit vector
constexpr int64_t kValuesAhead = 16;  // keys the value pass prefetches ahead

inline __m512 load_values(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_values(const uint16_t* p) {  // bfloat16, exact
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load_values(const Half* p) {  // float16, exact
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load_values(const int8_t* p) {  // int8 values q, exact (times their scale: kv_int8.h)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// r[i] = column i of the 16 x 16 matrix whose row j is r[j] (lane i of r[j])
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // r[4a + b] now holds, in its 128-bit lane L, column 4L + b of rows 4a..4a+3; the last pass gathers
  // each column's four lane groups (one from each quad of rows) into one vector
  for (int b = 0; b < 4; ++b) {
    const __m512 x0 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0x88), x1 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0xDD);
    const __m512 x2 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0x88), x3 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0xDD);
    t[b] = _mm512_shuffle_f32x4(x0, x2, 0x88);       // column b
    t[4 + b] = _mm512_shuffle_f32x4(x1, x3, 0x88);   // column 4 + b
    t[8 + b] = _mm512_shuffle_f32x4(x0, x2, 0xDD);   // column 8 + b
    t[12 + b] = _mm512_shuffle_f32x4(x1, x3, 0xDD);  // column 12 + b
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// QB query vectors' scores against KB vectors of 16 keys: score_block's chains, 16 lanes a vector
template <int QB, int KB>
[[gnu::noinline]] void wide_score_block(const float* qf, int64_t d, const float* kt, int64_t kt_stride, float scale, float* sc,
                      int64_t sc_stride) {
  __m512 acc[QB][KB];
  for (int i = 0; i < QB; ++i)
    for (int b = 0; b < KB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    __m512 k[KB];
    for (int b = 0; b < KB; ++b) k[b] = _mm512_loadu_ps(kt + c * kt_stride + b * kWide);
    for (int i = 0; i < QB; ++i) {
      const __m512 qv = _mm512_set1_ps(qf[i * d + c]);
      for (int b = 0; b < KB; ++b) acc[i][b] = _mm512_fmadd_ps(qv, k[b], acc[i][b]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < QB; ++i)
    for (int b = 0; b < KB; ++b) _mm512_storeu_ps(sc + i * sc_stride + b * kWide, _mm512_mul_ps(acc[i][b], s));
}

// span_values 16 lanes a vector (lane i of vector t is output dimension 16 t + i; an int8 row's values as q * s)
template <class C, int HP, int N>
[[gnu::noinline]] void wide_span_values(const float* p, int64_t p_stride, const int64_t* key_at, int64_t L, const C* v,
                      const float* alpha, float* acc, int64_t acc_stride, ValueScales scales) {
  __m512 a[HP][N];
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t)
      a[h][t] = _mm512_mul_ps(_mm512_loadu_ps(acc + h * acc_stride + t * kWide), _mm512_set1_ps(alpha[h]));
  for (int64_t j = 0; j < L; ++j) {
    const C* vp = v + key_at[j];
    if (j + kValuesAhead < L)  // the V row kValuesAhead keys on into L1 (a decode row's come from L2 or memory)
      for (int t = 0; t < N; t += 64 / (kWide * static_cast<int>(sizeof(C))))
        __builtin_prefetch(v + key_at[j + kValuesAhead] + t * kWide, 0, 3);
    __m512 pj[HP];
    for (int h = 0; h < HP; ++h) pj[h] = _mm512_set1_ps(p[h * p_stride + j]);
    const Half* row_scales = std::is_same_v<C, int8_t> ? scales.row(key_at[j]) : nullptr;  // found once per key
    for (int t = 0; t < N; ++t) {
      __m512 vt = load_values(vp + t * kWide);
      if constexpr (std::is_same_v<C, int8_t>)  // the scale widened by F16C (vec.h's to_float is scalar code)
        vt = _mm512_mul_ps(vt, _mm512_set1_ps(_cvtsh_ss(row_scales[scales.group(t * kWide)].bits)));
      for (int h = 0; h < HP; ++h) a[h][t] = _mm512_fmadd_ps(pj[h], vt, a[h][t]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) _mm512_storeu_ps(acc + h * acc_stride + t * kWide, a[h][t]);
}

// vexp's operations 16 lanes wide, each as Avx2Vec computes it in every lane
struct Avx512Vec {
  using V = __m512;
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V round_even(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V scale_pow2(V a, V n) {
    const __m512i shift = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), shift));
  }
  static V zero_below(V a, V x, float bound) {
    return _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(x, _mm512_set1_ps(bound), _CMP_LT_OQ), _mm512_setzero_ps());
  }
};

// direct_score_block 16 lanes a vector: one block's 16 keys read in place, by dimension. The three
// inner kernels are functions of their own (noinline): inlined into the item's loop, the compiler kept
// their pointers on the stack, and each load waited on a store of its address.
// An int8 cache's keys are read as q * s, run b's scales of group g at ks[b] + g * step (kv_int8.h).
template <int QB, int KB, class C>
[[gnu::noinline]] void wide_direct_score_block(const float* qf, int64_t d, const C* const* k, int64_t step, float scale,
                                               float* const* sc, int64_t sc_stride, const Half* const* ks) {
  constexpr bool kInt8 = std::is_same_v<C, int8_t>;
  __m512 acc[QB][KB];  // KB keys' vectors side by side: QB x KB chains in flight (three alone wait on fma latency)
  for (int i = 0; i < QB; ++i)
    for (int b = 0; b < KB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < d; c0 += kInt8 ? kKvGroup : d) {
    __m512 s[KB];
    if constexpr (kInt8)
      for (int b = 0; b < KB; ++b) s[b] = load_values(ks[b] + c0 / kKvGroup * step);
    for (int64_t c = c0; c < std::min(d, c0 + (kInt8 ? kKvGroup : d)); ++c) {
      __m512 kv[KB];
      for (int b = 0; b < KB; ++b) {
        kv[b] = load_values(k[b] + c * step);
        if constexpr (kInt8) kv[b] = _mm512_mul_ps(kv[b], s[b]);
      }
      for (int i = 0; i < QB; ++i) {
        const __m512 qv = _mm512_set1_ps(qf[i * d + c]);
        for (int b = 0; b < KB; ++b) acc[i][b] = _mm512_fmadd_ps(qv, kv[b], acc[i][b]);
      }
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < QB; ++i)
    for (int b = 0; b < KB; ++b) _mm512_storeu_ps(sc[b] + i * sc_stride, _mm512_mul_ps(acc[i][b], s));
}

constexpr int kWideValueAccumulators = 24;  // HP heads x N of the 32 registers (4 hold weights and values)

struct SixteenLanePasses {
  static constexpr int64_t kKeyVector = kWide;

  // EightLanePasses::transpose 16 keys at a time: by row, 16 dimensions at a time transposed in registers
  // (head_dim a multiple of 16); by dimension, a block's 16 keys at one dimension in one load
  template <class O, class C>
  static void transpose(const C* cache, const int64_t* k_at, int64_t n, int64_t d, int64_t step, float* kt,
                        int64_t stride) {
    if (step > 1) {
      for (int64_t i0 = 0; i0 < n; i0 += kWide) {
        if (k_at[i0] < 0 || k_at[i0 + kWide - 1] != k_at[i0] + kWide - 1) {  // not one block's 16 keys
          EightLanePasses::transpose<O>(cache, k_at + i0, kWide, d, step, kt + i0, stride);
          continue;
        }
        for (int64_t c = 0; c < d; ++c) _mm512_storeu_ps(kt + c * stride + i0, load_values(cache + k_at[i0] + c * step));
      }
      return;
    }
    if (d % kWide != 0) return EightLanePasses::transpose<O>(cache, k_at, n, d, step, kt, stride);
    for (int64_t i0 = 0; i0 < n; i0 += kWide)
      for (int64_t c0 = 0; c0 < d; c0 += kWide) {
        __m512 r[kWide];
        for (int64_t i = 0; i < kWide; ++i)
          r[i] = k_at[i0 + i] < 0 ? _mm512_setzero_ps() : load_values(cache + k_at[i0 + i] + c0);
        transpose16(r);
        for (int64_t c = 0; c < kWide; ++c) _mm512_storeu_ps(kt + (c0 + c) * stride + i0, r[c]);
      }
  }

  // EightLanePasses::weights over 16-key vectors: the same max, exps and partial sums (lanes 0-7 of each
  // vector the 8-lane pass's low sums, lanes 8-15 its high ones)
  template <class O>
  static void weights(float* sc, int64_t lo, int64_t hi, float& m, float& l, float& alpha) {
    using W = Avx512Vec;
    const int64_t a = mask_outside(sc, lo, hi), b = (hi + kTotalVector - 1) / kTotalVector * kTotalVector;
    __m512 mv = W::set1(-std::numeric_limits<float>::infinity());
    for (int64_t j = a; j < b; j += kWide) mv = W::max(W::load(sc + j), mv);
    const float m_new = std::max(m, _mm512_reduce_max_ps(mv));  // exact whatever the order
    alpha = m_new == m ? 1.0f : exp_one<O>(m - m_new);
    const __m512 mn = W::set1(m_new);
    __m512 total = W::zero();
    for (int64_t j = a; j < b; j += kWide) {
      const __m512 e = vexp<W>(W::sub(W::load(sc + j), mn));
      W::store(sc + j, e);
      total = W::add(total, e);
    }
    const __m256 folded = _mm256_add_ps(_mm512_castps512_ps256(total),
                                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(total), 1)));
    l = std::fma(l, alpha, O::hsum(folded));
    m = m_new;
  }

  // EightLanePasses::scores_in_place over 16-key vectors, up to four runs at a time
  template <class O, class C>
  static void scores_in_place(const float* qf, int64_t nq, int64_t d, const C* cache, const int64_t* k_at, int64_t n,
                              int64_t step, float scale, float* kt, int64_t kt_stride, float* sc, int64_t sc_stride,
                              const Half* k_scales) {
    constexpr int kQueries = 6, kRuns = 4;  // 24 accumulators
    const C* runs[kRuns];
    const Half* run_scales[kRuns] = {};  // an int8 cache's: each run's scales of group 0
    float* outs[kRuns];
    int pending = 0;
    const auto flush = [&] {
      for (int64_t q0 = 0; q0 < nq; q0 += kQueries)
        by_count<kQueries>(nq - q0, [&](auto queries) {
          float* at[kRuns];
          for (int b = 0; b < pending; ++b) at[b] = outs[b] + q0 * sc_stride;
          by_count<kRuns>(pending, [&](auto keys) {
            wide_direct_score_block<decltype(queries)::value, decltype(keys)::value>(qf + q0 * d, d, runs, step, scale,
                                                                                    at, sc_stride, run_scales);
          });
        });
      pending = 0;
    };
    for (int64_t u = 0; u < n; u += kWide) {
      if (k_at[u] < 0 || k_at[u + kWide - 1] != k_at[u] + kWide - 1) {
        if constexpr (std::is_same_v<C, int8_t>)
          dequantize_keys<O>(cache, k_scales, k_at + u, kWide, d, step, true, kt + u, kt_stride);
        else
          transpose<O>(cache, k_at + u, kWide, d, step, kt + u, kt_stride);
        scores<O>(qf, nq, d, kt + u, kt_stride, kWide, scale, sc + u, sc_stride);
        continue;
      }
      if constexpr (std::is_same_v<C, int8_t>) run_scales[pending] = k_scales + column_scale_at(k_at[u], d, step, 0);
      runs[pending] = cache + k_at[u];
      outs[pending++] = sc + u;
      if (pending == kRuns) flush();
    }
    if (pending > 0) flush();
  }

  template <class O>
  static void scores(const float* qf, int64_t nq, int64_t d, const float* kt, int64_t kt_stride, int64_t n, float scale,
                     float* sc, int64_t sc_stride) {
    constexpr int kQueries = 6, kKeys = 4;  // 24 accumulators, 4 keys and a query of the 32 registers
    // keys outer: a block of keys' transposed values stays in L1 while every query takes its scores
    for (int64_t j = 0; j < n; j += kKeys * kWide)
      by_count<kKeys>((n - j) / kWide, [&](auto keys) {
        for (int64_t q0 = 0; q0 < nq; q0 += kQueries)
          by_count<kQueries>(nq - q0, [&](auto queries) {
            wide_score_block<decltype(queries)::value, decltype(keys)::value>(qf + q0 * d, d, kt + j, kt_stride, scale,
                                                                           sc + q0 * sc_stride + j, sc_stride);
          });
      });
  }

  template <class O, class C>
  static void values(int64_t group, int64_t d, const float* p, int64_t p_stride, const int64_t* key_at, int64_t L,
                     const C* v_cache, const float* alpha, float* acc, const Half* v_scales = nullptr) {
    if (d % kWide != 0)
      return EightLanePasses::values<O, C>(group, d, p, p_stride, key_at, L, v_cache, alpha, acc, v_scales);
    value_pieces<kWideValueAccumulators>(
        kWide, group, d, p, p_stride, v_cache, alpha, acc,
        [&](auto heads, auto vectors, const float* ph, const C* v, const float* al, float* o) {
          wide_span_values<C, decltype(heads)::value, decltype(vectors)::value>(ph, p_stride, key_at, L, v, al, o, d,
                                                                                {v_scales, d, v - v_cache});
        });
  }
};

}  // namespace

void use_avx512_attention(KernelTable& t) {
  t.attention_f32 = &attention_items<Avx2Vec, float, float, SixteenLanePasses>;
  t.attention_bf16 = &attention_items<Avx2Vec, uint16_t, uint16_t, SixteenLanePasses>;
  t.attention_f32_f16 = &attention_items<Avx2Vec, float, Half, SixteenLanePasses>;
  t.attention_f32_i8 = &attention_items<Avx2Vec, float, int8_t, SixteenLanePasses>;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
void use_avx512_attention(KernelTable&) {}
}  // namespace nxk
#endif
