// The AVX-512 table: the AVX2 table with its linears (float32, bfloat16 and the quantized formats)
// replaced by 16-lane ones.
//
// A linear's lanes are output columns, never terms of one sum: each output is still the one fma chain
// over k = 0..K-1 starting from 0 that kernels.h promises, so these linears give the AVX2 and generic
// linears' bits (the tests compare all three). What changes is speed where a step has several rows (a
// speculative verify, a batch): one 16-lane fma per panel and row instead of two 8-lane ones, and 32
// registers, so up to 12 rows share each weight load; a quantized weight is dequantized 16 columns at
// a time, once per span of K for all the rows. The integer-activation linears' input quantizer in 16
// lanes (isa_avx512_quantize.cpp); those linears themselves stay the AVX2 ones here (the avx512_vnni
// table, isa_avx512_vnni.cpp, replaces them).
// Attention with its score and value passes 16 lanes wide (isa_avx512_attention.cpp). Everything else
// (norms, softmax) is the AVX2 code: its 8-lane reductions fix their order, so they keep their width.
// table_for (ops.h) gives this table only on a CPU with AVX512F (with AVX2, FMA and F16C); Python picks
// it by itself when torch's own dispatch (ATEN_CPU_CAPABILITY) also allows AVX-512 and the CPU lacks VNNI.
#if defined(__x86_64__) || defined(_M_X64)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "vec.h"

#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"
#include "scales_avx512.h"

namespace nxk {
namespace {

constexpr int kGroupRows = 12;  // rows per register tile: 12 rows x 2 panels = 24 of the 32 registers

inline __m512 load_panel_row(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_panel_row(const uint16_t* p) {  // 16 bfloat16 -> float32 (exact)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load_panel_row(const Half* p) {  // 16 float16 -> float32 (exact)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// the first ``cols`` (<= 16) of one output row's 16 columns
inline void store_columns(float* y, __m512 v, int64_t cols) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << cols) - 1), v);
}

// R rows x P panels over n k's of one span: x at the span's first k of row 0 (row r at x + r * K),
// panel at the span's first k of panel 0 (panel p at panel + p * panel_step). acc [R][P][16] carries
// the chains between spans (zeros for the first span); one register per (row, panel).
template <class W, int R, int P>
void tile_span(const float* x, int64_t K, int64_t n, const W* panel, int64_t panel_step, bool first, float* acc_mem) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_mem + (r * P + p) * kPanel);
  for (int64_t k = 0; k < n; ++k) {
    __m512 w[P];
    for (int p = 0; p < P; ++p) {
      __builtin_prefetch(panel + p * panel_step + (k + kPrefetchAhead) * kPanel);
      w[p] = load_panel_row(panel + p * panel_step + k * kPanel);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * K + k]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xb, w[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(acc_mem + (r * P + p) * kPanel, acc[r][p]);
}

template <class W, int P>
void tile_span_rows(int64_t rows, const float* x, int64_t K, int64_t n, const W* panel, int64_t step, bool first,
                    float* acc) {
  switch (rows) {
#define NXK_ROWS(r) \
  case r: tile_span<W, r, P>(x, K, n, panel, step, first, acc); break;
    NXK_ROWS(12) NXK_ROWS(11) NXK_ROWS(10) NXK_ROWS(9) NXK_ROWS(8) NXK_ROWS(7)
    NXK_ROWS(6) NXK_ROWS(5) NXK_ROWS(4) NXK_ROWS(3) NXK_ROWS(2)
#undef NXK_ROWS
    default: tile_span<W, 1, P>(x, K, n, panel, step, first, acc); break;
  }
}

template <class W>
void tile_span_rows_wide(int64_t rows, const float* x, int64_t K, int64_t n, const W* panel, int64_t step, bool first,
                         float* acc) {  // four panels side by side, for up to 4 rows
  switch (rows) {
    case 4: tile_span<W, 4, 4>(x, K, n, panel, step, first, acc); break;
    case 3: tile_span<W, 3, 4>(x, K, n, panel, step, first, acc); break;
    case 2: tile_span<W, 2, 4>(x, K, n, panel, step, first, acc); break;
    default: tile_span<W, 1, 4>(x, K, n, panel, step, first, acc); break;
  }
}

// Column panels [panel_begin, panel_end) of y = x @ W^T. Rows by blocks of kRowBlock (their inputs
// stay in cache), each block's rows in register tiles of up to 12 rows; panels four side by side for a
// block of up to 4 rows, else two; K in spans of kDepthSpan, every tile of the block running over one
// span before the next span starts (the span's weights come from memory once, then from L1).
// span_of(p, P, k0, k1) gives the weights of panels p .. p + P - 1 over k0 .. k1 - 1: a pointer to
// panel p's row k0 and the distance between panels (the packed weight itself, or a span dequantized
// into a buffer).
template <class W, class SpanOf>
void panels_by_spans(const float* x, int64_t M, int64_t K, int64_t N, float* y, int64_t panel_begin,
                     int64_t panel_end, SpanOf span_of) {
  alignas(64) float acc[kRowBlock * 4 * kPanel];  // [rows][P][16]: the chains between spans (24 KB)
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t rows = std::min(M, m0 + kRowBlock) - m0;
    for (int64_t p = panel_begin; p < panel_end;) {
      const int64_t left = panel_end - p;
      const int64_t P = rows <= 4 && left >= 4 ? 4 : std::min<int64_t>(2, left);
      for (int64_t k0 = 0; k0 < K; k0 += kDepthSpan) {
        const int64_t n = std::min(K, k0 + kDepthSpan) - k0;
        const auto [panel, step] = span_of(p, P, k0, k0 + n);
        for (int64_t g = 0; g < rows; g += kGroupRows) {
          const int64_t r = std::min<int64_t>(kGroupRows, rows - g);
          const float* xg = x + (m0 + g) * K + k0;
          float* a = acc + g * P * kPanel;
          if (P == 4) {
            tile_span_rows_wide<W>(r, xg, K, n, panel, step, k0 == 0, a);
          } else if (P == 2) {
            tile_span_rows<W, 2>(r, xg, K, n, panel, step, k0 == 0, a);
          } else {
            tile_span_rows<W, 1>(r, xg, K, n, panel, step, k0 == 0, a);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < P; ++j) {
          const int64_t col = (p + j) * kPanel;
          store_columns(y + (m0 + r) * N + col, _mm512_loadu_ps(acc + (r * P + j) * kPanel), std::min(kPanel, N - col));
        }
      p += P;
    }
  }
}

template <class W>
void linear_panels_avx512(const float* x, int64_t M, int64_t K, const W* packed, int64_t N, float* y,
                          int64_t panel_begin, int64_t panel_end) {
  const int64_t step = K * kPanel;
  panels_by_spans<W>(x, M, K, N, y, panel_begin, panel_end, [&](int64_t p, int64_t, int64_t k0, int64_t) {
    return std::pair<const W*, int64_t>{packed + p * step + k0 * kPanel, step};
  });
}

// ---- quantized weights (quantized.h's formats), dequantized 16 at a time ----

// One tile's scales; ``at(kk)`` is row kk's 16 weights: the products quantized.h's QTile gives, one
// element at a time (q * d, or fma(q, d, m)), so the same float32 values.
template <int F>
struct QTile16 {
  const uint8_t* quants;
  __m512 d, m;  // Q8S, Q3S, Q2S: m holds the scales of k 16..31
  __m512 n_low, n_high;  // Q2S: the mins of k 0..15 and 16..31

  static __m512 half16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  QTile16() = default;
  QTile16(const uint8_t* panel, int64_t b) : quants(block_quants<F>(panel, b)) {
    alignas(64) float buf[kHeadFloats];
    const uint8_t* head = block_head16<F>(panel, b, buf);
    if constexpr (has_formed_scales(F)) {
      d = _mm512_loadu_ps(reinterpret_cast<const float*>(head));
      m = _mm512_loadu_ps(reinterpret_cast<const float*>(head + kWideScaleBytes));
      if constexpr (F == kQ2S) {
        n_low = _mm512_loadu_ps(reinterpret_cast<const float*>(head + 2 * kWideScaleBytes));
        n_high = _mm512_loadu_ps(reinterpret_cast<const float*>(head + 3 * kWideScaleBytes));
      }
    } else if constexpr (has_min(F)) {  // Q4, Q5
      d = half16(head);
      m = half16(head + kScaleBytes);
    } else {
      d = half16(head);
      m = _mm512_setzero_ps();
    }
  }

  __m512 at(int64_t kk) const {
    if constexpr (F == kQ8) {
      const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + kk * kPanel));
      return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)), d);
    } else if constexpr (F == kQ2S) {  // q from the 2-bit plane, w = fma(q, d, m) per half block
      int32_t pairs;
      std::memcpy(&pairs, quants + kk * 4, 4);
      const __m512i pair_shift = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(pairs), pair_shift), _mm512_set1_epi32(3));
      const bool low = kk < kQBlock / 2;
      return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), low ? d : m, low ? n_low : n_high);
    } else if constexpr (F == kQ3S) {  // u = two | bit << 2 from the two planes, q = u - 4
      int32_t pairs;
      uint16_t bits;
      std::memcpy(&pairs, quants + kk * 4, 4);
      std::memcpy(&bits, quants + kTwoBitPlane + kk * 2, 2);
      const __m512i pair_shift = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i two = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(pairs), pair_shift), _mm512_set1_epi32(3));
      const __m512i third = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(bits), lanes), _mm512_set1_epi32(1));
      const __m512i u = _mm512_or_si512(two, _mm512_slli_epi32(third, 2));
      const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(u, _mm512_set1_epi32(quant_offset(F))));
      return _mm512_mul_ps(q, kk < kQBlock / 2 ? d : m);
    } else if constexpr (F == kQ8S) {  // u = low | high << 4 from the two planes, q = u - 32
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + kk * (kPanel / 2)));
      const __m128i both = _mm_and_si128(_mm_unpacklo_epi64(bytes, _mm_srli_epi16(bytes, 4)), _mm_set1_epi8(0x0F));
      int32_t word;
      std::memcpy(&word, quants + kLowPlane + kk * 4, 4);
      const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i high = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), shifts), _mm512_set1_epi32(3));
      const __m512i u = _mm512_or_si512(_mm512_cvtepu8_epi32(both), _mm512_slli_epi32(high, 4));
      const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(u, _mm512_set1_epi32(32)));
      return _mm512_mul_ps(q, kk < kQBlock / 2 ? d : m);
    } else {  // byte j: column j in its low nibble, column j + 8 in its high one
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + kk * (kPanel / 2)));
      const __m128i both = _mm_and_si128(_mm_unpacklo_epi64(bytes, _mm_srli_epi16(bytes, 4)), _mm_set1_epi8(0x0F));
      if constexpr (is_iq4(F)) {  // each nibble's IQ4 value, looked up among 16 floats
        const __m512 values = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values))));
        return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(both), values), d);
      }
      __m512i u = _mm512_cvtepu8_epi32(both);
      if constexpr (has_fifth_bit(F)) {  // the fifth bit: column c at bit c of row kk's 2 plane bytes
        uint16_t word;
        std::memcpy(&word, quants + kLowPlane + kk * 2, 2);
        const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i high = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), lanes), _mm512_set1_epi32(1));
        u = _mm512_or_si512(u, _mm512_slli_epi32(high, 4));
      }
      if constexpr (quant_offset(F) != 0)  // Q5Z, Q4Z: (u - offset) * d
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(u, _mm512_set1_epi32(quant_offset(F)))), d);
      return _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), d, m);
    }
  }
};

// panels [p, p + P) over k0 .. k1 - 1 (multiples of 32) dequantized into out [P][kDepthSpan][16]
template <int F>
void dequantize_span(const uint8_t* packed, int64_t panel_bytes, int64_t p, int64_t P, int64_t k0, int64_t k1,
                     float* out) {
  for (int64_t j = 0; j < P; ++j) {
    const uint8_t* panel = packed + (p + j) * panel_bytes;
    float* rows = out + j * kDepthSpan * kPanel;
    for (int64_t b = k0 / kQBlock; b < k1 / kQBlock; ++b) {
      const QTile16<F> t(panel, b);
      float* row = rows + (b * kQBlock - k0) * kPanel;
      for (int64_t kk = 0; kk < kQBlock; ++kk) _mm512_store_ps(row + kk * kPanel, t.at(kk));
    }
  }
}

// R rows x P panels over the whole of K, weights dequantized in registers (a few rows: the weights
// are used too few times to be worth a trip through a buffer), stored to y
template <int F, int R, int P>
void qtile(const float* x, int64_t K, const uint8_t* panel, int64_t panel_bytes, float* y, int64_t N, int64_t col) {
  constexpr int64_t TB = tile_bytes(F);
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    QTile16<F> t[P];
    for (int p = 0; p < P; ++p) {
      const uint8_t* tile = tile_at<F>(panel + p * panel_bytes, b);
      __builtin_prefetch(tile + 4 * TB);
      __builtin_prefetch(tile + 4 * TB + 64);
      t[p] = QTile16<F>(panel + p * panel_bytes, b);
    }
    for (int64_t kk = 0; kk < kQBlock; ++kk) {
      __m512 w[P];
      for (int p = 0; p < P; ++p) w[p] = t[p].at(kk);
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * K + b * kQBlock + kk]);
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xb, w[p], acc[r][p]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      const int64_t c = col + p * kPanel;
      store_columns(y + r * N + c, acc[r][p], std::min(kPanel, N - c));
    }
}

template <int F, int P>
void qtile_rows(int64_t rows, const float* x, int64_t K, const uint8_t* panel, int64_t panel_bytes, float* y,
                int64_t N, int64_t col) {
  switch (rows) {
    case 3: qtile<F, 3, P>(x, K, panel, panel_bytes, y, N, col); break;
    case 2: qtile<F, 2, P>(x, K, panel, panel_bytes, y, N, col); break;
    default: qtile<F, 1, P>(x, K, panel, panel_bytes, y, N, col); break;
  }
}

constexpr int64_t kInRegisterRows = 3;  // up to this many rows, quantized weights are dequantized in registers

// Column panels [panel_begin, panel_end) of y = x @ W^T for a packed quantized W: a few rows with the
// weights dequantized in registers, four panels side by side; more rows, each span of weights
// dequantized once into an L1 buffer that every row tile then reads. Either way each output is the
// one fma chain over k of the float32 linear over the dequantized weight: the same bits.
template <int F>
void qlinear_panels_avx512(const float* x, int64_t M, int64_t K, const uint8_t* packed, int64_t N, float* y,
                           int64_t panel_begin, int64_t panel_end) {
  const int64_t panel_bytes = panel_bytes_of(F, K);
  if (M <= kInRegisterRows) {
    for (int64_t p = panel_begin; p < panel_end;) {
      const uint8_t* panel = packed + p * panel_bytes;
      if (p + 4 <= panel_end) {
        qtile_rows<F, 4>(M, x, K, panel, panel_bytes, y, N, p * kPanel);
        p += 4;
      } else {
        qtile_rows<F, 1>(M, x, K, panel, panel_bytes, y, N, p * kPanel);
        p += 1;
      }
    }
    return;
  }
  alignas(64) float span[4 * kDepthSpan * kPanel];  // up to 4 panels x one span (32 KB)
  panels_by_spans<float>(x, M, K, N, y, panel_begin, panel_end, [&](int64_t p, int64_t P, int64_t k0, int64_t k1) {
    dequantize_span<F>(packed, panel_bytes, p, P, k0, k1, span);
    return std::pair<const float*, int64_t>{span, kDepthSpan * kPanel};
  });
}

}  // namespace

KernelTable avx512_table() {
  KernelTable t = avx2_table();
  t.name = "avx512";
  t.linear_f32 = &linear_panels_avx512<float>;
  t.linear_bf16 = &linear_panels_avx512<uint16_t>;
  t.linear_f16 = &linear_panels_avx512<Half>;
  for_each_base_format([&t](auto format) {
    constexpr int F = decltype(format)::value;
    t.qlinear[F] = &qlinear_panels_avx512<F>;
  });
  use_avx512_attention(t);
  use_avx512_quantizers(t);
  return t;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
KernelTable avx512_table() { return avx2_table(); }
}  // namespace nxk
#endif
