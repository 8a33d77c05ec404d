// The AVX-512 table: the AVX2 table with its float32 and bfloat16 linears replaced by 16-lane ones.
//
// A linear's lanes are output columns, never terms of one sum: each output is still the one fma chain
// over k = 0..K-1 starting from 0 that kernels.h promises, so these linears give the AVX2 and generic
// linears' bits (the tests compare all three). What changes is speed where a step has several rows (a
// speculative verify, a batch): one 16-lane fma per panel and row instead of two 8-lane ones, and 32
// registers, so up to 12 rows share each weight load. Everything else (attention, norms, softmax, the
// quantized linears) is the AVX2 code: its 8-lane reductions fix their order, so they keep their width.
// bindings.cpp uses this table only when the CPU has AVX512F (with AVX2, FMA and F16C) and torch's own
// dispatch (ATEN_CPU_CAPABILITY) allows AVX-512.
#if defined(__x86_64__) || defined(_M_X64)
#include <algorithm>
#include <cstdint>

#include "vec.h"

#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>

#include "table.h"

namespace nxk {
namespace {

constexpr int kGroupRows = 12;  // rows per register tile: 12 rows x 2 panels = 24 of the 32 registers

inline __m512 load_panel_row(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_panel_row(const uint16_t* p) {  // 16 bfloat16 -> float32 (exact)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// R rows x P panels over k in [k0, k1). x: the rows' inputs, row r at x + r * K. acc [R][P] carries
// the chains between spans (zeros at k0 = 0); one register per (row, panel), 16 output columns each.
template <class W, int R, int P>
void tile_span(const float* x, int64_t K, int64_t k0, int64_t k1, const W* panel, int64_t panel_step, float* acc_mem) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_mem + (r * P + p) * kPanel);
  for (int64_t k = k0; k < k1; ++k) {
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
void tile_span_rows(int64_t rows, const float* x, int64_t K, int64_t k0, int64_t k1, const W* panel, int64_t step,
                    float* acc) {
  switch (rows) {
#define NXK_ROWS(n) \
  case n: tile_span<W, n, P>(x, K, k0, k1, panel, step, acc); break;
    NXK_ROWS(12) NXK_ROWS(11) NXK_ROWS(10) NXK_ROWS(9) NXK_ROWS(8) NXK_ROWS(7)
    NXK_ROWS(6) NXK_ROWS(5) NXK_ROWS(4) NXK_ROWS(3) NXK_ROWS(2)
#undef NXK_ROWS
    default: tile_span<W, 1, P>(x, K, k0, k1, panel, step, acc); break;
  }
}

template <class W>
void tile_span_rows_wide(int64_t rows, const float* x, int64_t K, int64_t k0, int64_t k1, const W* panel, int64_t step,
                         float* acc) {  // four panels side by side, for up to 4 rows
  switch (rows) {
    case 4: tile_span<W, 4, 4>(x, K, k0, k1, panel, step, acc); break;
    case 3: tile_span<W, 3, 4>(x, K, k0, k1, panel, step, acc); break;
    case 2: tile_span<W, 2, 4>(x, K, k0, k1, panel, step, acc); break;
    default: tile_span<W, 1, 4>(x, K, k0, k1, panel, step, acc); break;
  }
}

// Column panels [panel_begin, panel_end) of y = x @ W^T. Rows by blocks of kRowBlock (their inputs
// stay in cache), each block's rows in register tiles of up to 12 rows; panels four side by side for a
// block of up to 4 rows, else two; K in spans of kDepthSpan, every tile of the block running over one
// span before the next span starts (the span's weights come from memory once, then from L1).
template <class W>
void linear_panels_avx512(const float* x, int64_t M, int64_t K, const W* packed, int64_t N, float* y,
                          int64_t panel_begin, int64_t panel_end) {
  const int64_t step = K * kPanel;
  alignas(64) float acc[kRowBlock * 4 * kPanel];  // [rows][P][16]: the chains between spans (24 KB)
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t rows = std::min(M, m0 + kRowBlock) - m0;
    for (int64_t p = panel_begin; p < panel_end;) {
      const int64_t left = panel_end - p;
      const int64_t P = rows <= 4 && left >= 4 ? 4 : std::min<int64_t>(2, left);
      const W* panel = packed + p * step;
      for (int64_t k0 = 0; k0 < K; k0 += kDepthSpan) {
        const int64_t k1 = std::min(K, k0 + kDepthSpan);
        for (int64_t g = 0; g < rows; g += kGroupRows) {
          const int64_t n = std::min<int64_t>(kGroupRows, rows - g);
          const float* xg = x + (m0 + g) * K;
          float* a = acc + g * P * kPanel;
          if (P == 4) {
            tile_span_rows_wide<W>(n, xg, K, k0, k1, panel, step, a);
          } else if (P == 2) {
            tile_span_rows<W, 2>(n, xg, K, k0, k1, panel, step, a);
          } else {
            tile_span_rows<W, 1>(n, xg, K, k0, k1, panel, step, a);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < P; ++j) {
          const int64_t col = (p + j) * kPanel, cols = std::min(kPanel, N - col);
          const auto keep = static_cast<__mmask16>((1u << cols) - 1);  // cols <= 16
          _mm512_mask_storeu_ps(y + (m0 + r) * N + col, keep, _mm512_loadu_ps(acc + (r * P + j) * kPanel));
        }
      p += P;
    }
  }
}

}  // namespace

KernelTable avx512_table() {
  KernelTable t = avx2_table();
  t.name = "avx512";
  t.linear_f32 = &linear_panels_avx512<float>;
  t.linear_bf16 = &linear_panels_avx512<uint16_t>;
  return t;
}

}  // namespace nxk
#else
#include "table.h"
namespace nxk {
KernelTable avx512_table() { return avx2_table(); }
}  // namespace nxk
#endif
