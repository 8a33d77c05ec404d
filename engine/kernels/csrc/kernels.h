// The fixed-order kernels, written once over a vector struct O (vec.h) and compiled per instruction set.
//
// The order of every reduction is set here, never by a library, and depends on the row's own data
// and position alone, never on how many rows share the call or which thread computes them:
//   linear     y[m, n] = fma chain over k = 0, 1, ..., K-1, starting from 0 (one chain per output)
//   attention  per (query row, head), over spans of key positions (attention.h)
//   rms_norm   per row: sum of squares in 8 lanes over the row, hsum, then x * (1 / sqrt(ms + eps))
//   softmax    per row: exact max, exp in lanes, lane sums in index order, hsum
// Work is split between threads over outputs (column panels, rows, heads), never inside a reduction.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "vec.h"

namespace nxk {

constexpr int64_t kPanel = 16;      // output columns per packed weight panel: two vectors
constexpr int64_t kRowTile = 6;     // rows per linear micro-tile (12 accumulators, 16 registers)
constexpr int64_t kRowBlock = 96;   // rows whose inputs stay in cache while the panels stream by
constexpr int64_t kPrefetchAhead = 64;  // weight rows (of one panel) prefetched ahead of the fma loop
constexpr int64_t kWideRows = 12;       // up to this many rows, linears take two panels side by side
constexpr int64_t kDepthSpan = 128;     // k's per span when several row groups share two panels (16 KB of float32)
constexpr int64_t kMaxHeadDim = 512;  // the largest head_dim the attention kernels accept
constexpr float kExpFloor = -86.0f; // exp below this is flushed to 0 (keeps 2^n a normal float)
constexpr float kExpCeiling = 88.0f; // exp above this is exp(88)

// exp(x), x clamped to at most 88: Cody-Waite reduction x = n ln2 + r, a degree-6 polynomial in r, then 2^n.
template <class O>
typename O::V vexp(typename O::V x) {
  using V = typename O::V;
  const V xc = O::min(O::max(x, O::set1(kExpFloor)), O::set1(kExpCeiling));
  const V n = O::round_even(O::mul(xc, O::set1(1.44269504088896341f)));
  V r = O::fma(n, O::set1(-0.693359375f), xc);
  r = O::fma(n, O::set1(2.12194440e-4f), r);
  V p = O::set1(1.9875691500e-4f);
  p = O::fma(p, r, O::set1(1.3981999507e-3f));
  p = O::fma(p, r, O::set1(8.3334519073e-3f));
  p = O::fma(p, r, O::set1(4.1665795894e-2f));
  p = O::fma(p, r, O::set1(1.6666665459e-1f));
  p = O::fma(p, r, O::set1(5.0000001201e-1f));
  V y = O::fma(p, O::mul(r, r), r);
  y = O::add(y, O::set1(1.0f));
  return O::zero_below(O::scale_pow2(y, n), x, kExpFloor);
}

// ---- linear: x [M, K] float32, packed weight [P, K, 16] (float32, bf16 or f16 bits), y [M, N] float32 ----
// A 16-bit weight is widened to float32 in registers as it is loaded (exact), so its outputs are the
// float32 linear's over the widened weight, bit for bit.

// the first ``cols`` (<= 16) of one output row's 16 columns, held in two vectors
template <class O>
void store_columns(float* y, typename O::V a0, typename O::V a1, int64_t cols) {
  if (cols == kPanel) {
    O::store(y, a0);
    O::store(y + kLanes, a1);
    return;
  }
  float tmp[kPanel];
  O::store(tmp, a0);
  O::store(tmp + kLanes, a1);
  std::copy(tmp, tmp + cols, y);
}

// rows [m0, m1) of a K-wide input into xt by tiles of kRowTile rows, interleaved: tile t holds
// xt[(t * K + k) * kRowTile + r] = value(m0 + t * kRowTile + r, k), zeros past m1. Returns the tile
// count. static: each instruction set's file keeps its own copy (an inline one could be linked from
// the AVX2 file into the generic path).
template <class Value>
static inline int64_t interleave_rows_of(int64_t K, int64_t m0, int64_t m1, std::vector<float>& xt, const Value& value) {
  const int64_t tiles = (m1 - m0 + kRowTile - 1) / kRowTile;
  xt.assign(tiles * K * kRowTile, 0.0f);
  for (int64_t m = m0; m < m1; ++m) {
    float* tile = xt.data() + (m - m0) / kRowTile * K * kRowTile + (m - m0) % kRowTile;
    for (int64_t k = 0; k < K; ++k) tile[k * kRowTile] = value(m, k);
  }
  return tiles;
}

// interleave_rows_of over the rows of x [M, K] float32
static inline int64_t interleave_rows(const float* x, int64_t K, int64_t m0, int64_t m1, std::vector<float>& xt) {
  return interleave_rows_of(K, m0, m1, xt, [x, K](int64_t m, int64_t k) { return x[m * K + k]; });
}

// R rows (R <= kRowTile) x 16 columns. xt: the rows' inputs interleaved, xt[k * kRowTile + r].
template <class O, class W, int R>
void linear_tile(const float* xt, int64_t K, const W* panel, float* y, int64_t ldy, int64_t cols) {
  using V = typename O::V;
  V acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = O::zero();
  for (int64_t k = 0; k < K; ++k) {
    __builtin_prefetch(panel + (k + kPrefetchAhead) * kPanel);  // more lines in flight than the core would keep
    const V w0 = O::load(panel + k * kPanel);
    const V w1 = O::load(panel + k * kPanel + kLanes);
    for (int r = 0; r < R; ++r) {
      const V xb = O::set1(xt[k * kRowTile + r]);
      acc[r][0] = O::fma(xb, w0, acc[r][0]);
      acc[r][1] = O::fma(xb, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) store_columns<O>(y + r * ldy, acc[r][0], acc[r][1], cols);
}

template <class O, class W>
void linear_tile_rows(int64_t rows, const float* xt, int64_t K, const W* panel, float* y, int64_t ldy, int64_t cols) {
  switch (rows) {
    case 6: linear_tile<O, W, 6>(xt, K, panel, y, ldy, cols); break;
    case 5: linear_tile<O, W, 5>(xt, K, panel, y, ldy, cols); break;
    case 4: linear_tile<O, W, 4>(xt, K, panel, y, ldy, cols); break;
    case 3: linear_tile<O, W, 3>(xt, K, panel, y, ldy, cols); break;
    case 2: linear_tile<O, W, 2>(xt, K, panel, y, ldy, cols); break;
    default: linear_tile<O, W, 1>(xt, K, panel, y, ldy, cols); break;
  }
}

// R rows x P panels at once (R <= 4): a few rows' fma chains on one panel wait on the fma latency and on
// one stream of weights, so a few rows take two or three panels side by side (measured: 6 rows of
// SmolLM2's linears 15% faster, 2 rows 20%). Every output is still the same single chain over
// k = 0..K-1 as in linear_tile, so the bits depend neither on P nor on how rows are grouped.
// This runs over k in [k0, k1) only, its accumulators carried in memory between calls: acc
// [R][2P][kLanes] holds the chains after k0 - 1 (ignored at k0 = 0, where they start from 0) and
// receives them after k1 - 1. A value stored and loaded back is the same value, so every output is
// one fma chain over k = 0..K-1 however K is cut.
template <class O, class W, int R, int P>
void linear_tile_wide_span(const float* xt, int64_t k0, int64_t k1, const W* panel, int64_t panel_step,
                           float* acc_mem) {
  using V = typename O::V;
  V acc[R][2 * P];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * P; ++j) acc[r][j] = k0 == 0 ? O::zero() : O::load(acc_mem + (r * 2 * P + j) * kLanes);
  for (int64_t k = k0; k < k1; ++k) {
    V w[2 * P];
    for (int p = 0; p < P; ++p) {
      __builtin_prefetch(panel + p * panel_step + (k + kPrefetchAhead) * kPanel);
      w[2 * p] = O::load(panel + p * panel_step + k * kPanel);
      w[2 * p + 1] = O::load(panel + p * panel_step + k * kPanel + kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const V xb = O::set1(xt[k * kRowTile + r]);
      for (int j = 0; j < 2 * P; ++j) acc[r][j] = O::fma(xb, w[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * P; ++j) O::store(acc_mem + (r * 2 * P + j) * kLanes, acc[r][j]);
}

// accumulators acc [rows][2P][kLanes] (P panels side by side from column col) into y's rows
template <class O>
void store_accumulators(const float* acc, int64_t rows, int P, float* y, int64_t ldy, int64_t col, int64_t N) {
  for (int64_t r = 0; r < rows; ++r)
    for (int p = 0; p < P; ++p) {
      const float* a = acc + (r * 2 * P + 2 * p) * kLanes;
      store_columns<O>(y + r * ldy + col + p * kPanel, O::load(a), O::load(a + kLanes),
                       std::min(kPanel, N - col - p * kPanel));
    }
}

// R rows x P panels over the whole of K, stored to y
template <class O, class W, int R, int P>
void linear_tile_wide(const float* xt, int64_t K, const W* panel, int64_t panel_step, float* y, int64_t ldy,
                      int64_t col, int64_t N) {
  alignas(32) float acc[R * 2 * P * kLanes];
  linear_tile_wide_span<O, W, R, P>(xt, 0, K, panel, panel_step, acc);
  store_accumulators<O>(acc, R, P, y, ldy, col, N);
}

// rows [0, rows) of an interleaved block (rows <= kWideRows) x two panels side by side, in groups of at
// most 4 rows (3 + 3 per full tile of the interleaving), K cut in spans of kDepthSpan: each group runs
// over one span before the next group does, so the span's weights come from memory once and stay in
// L1 for the other groups (the memory streams the next span, prefetched, while they compute).
template <class O, class W>
void linear_pair_grouped(const float* xt, int64_t K, int64_t rows, const W* panel, float* y, int64_t ldy,
                         int64_t col, int64_t N) {
  struct Group {
    int64_t first, count;  // rows
  };
  Group groups[kWideRows];
  int64_t ngroups = 0;
  for (int64_t t = 0; t * kRowTile < rows; ++t) {  // groups stay within one tile of the interleaving
    const int64_t m = t * kRowTile, left = std::min(kRowTile, rows - m);
    if (left > 4) {
      groups[ngroups++] = {m, 3};
      groups[ngroups++] = {m + 3, left - 3};
    } else {
      groups[ngroups++] = {m, left};
    }
  }
  alignas(32) float acc[kWideRows * 4 * kLanes];  // [rows][2 panels x 2 vectors][kLanes]
  const int64_t step = K * kPanel;
  for (int64_t k0 = 0; k0 < K; k0 += kDepthSpan) {
    const int64_t k1 = std::min(K, k0 + kDepthSpan);
    for (int64_t g = 0; g < ngroups; ++g) {
      const int64_t m = groups[g].first;
      const float* xr = xt + m / kRowTile * K * kRowTile + m % kRowTile;
      float* a = acc + m * 4 * kLanes;
      switch (groups[g].count) {
        case 4: linear_tile_wide_span<O, W, 4, 2>(xr, k0, k1, panel, step, a); break;
        case 3: linear_tile_wide_span<O, W, 3, 2>(xr, k0, k1, panel, step, a); break;
        case 2: linear_tile_wide_span<O, W, 2, 2>(xr, k0, k1, panel, step, a); break;
        default: linear_tile_wide_span<O, W, 1, 2>(xr, k0, k1, panel, step, a); break;
      }
    }
  }
  store_accumulators<O>(acc, rows, 2, y, ldy, col, N);
}

// Column panels [panel_begin, panel_end) of y = x @ W^T. Rows go by blocks whose inputs, interleaved
// by tiles of kRowTile rows, stay in cache while the panels stream by. The interleaving moves inputs
// only; every output is still one fma chain over k = 0..K-1.
template <class O, class W>
void linear_panels(const float* x, int64_t M, int64_t K, const W* packed, int64_t N, float* y,
                   int64_t panel_begin, int64_t panel_end) {
  static_assert(kRowTile == 6, "linear_tile_rows covers 1..6 rows");
  std::vector<float> xt;
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    const int64_t tiles = interleave_rows(x, K, m0, m1, xt);
    const int64_t rows = m1 - m0;
    for (int64_t p = panel_begin; p < panel_end; ++p) {
      const W* panel = packed + p * K * kPanel;
      if (rows == 1 && p + 3 <= panel_end) {  // one row: three panels side by side
        linear_tile_wide<O, W, 1, 3>(xt.data(), K, panel, K * kPanel, y + m0 * N, N, p * kPanel, N);
        p += 2;
        continue;
      }
      if (rows <= kWideRows && p + 2 <= panel_end) {  // a few rows: in groups over two panels side by side
        linear_pair_grouped<O, W>(xt.data(), K, rows, panel, y + m0 * N, N, p * kPanel, N);
        p += 1;
        continue;
      }
      const int64_t col = p * kPanel, cols = std::min(kPanel, N - col);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m = m0 + t * kRowTile;
        linear_tile_rows<O, W>(std::min(kRowTile, m1 - m), xt.data() + t * K * kRowTile, K, panel,
                               y + m * N + col, N, cols);
      }
    }
  }
}

// ---- row-wise reductions ----

template <class O, class T>
float sum_of_squares(const T* row, int64_t D) {
  using V = typename O::V;
  V acc = O::zero();
  int64_t i = 0;
  for (; i + kLanes <= D; i += kLanes) {
    const V v = O::load(row + i);
    acc = O::fma(v, v, acc);
  }
  if (i < D) {  // the tail in lanes 0.., zeros after: squares of zero add nothing
    float tail[kLanes] = {0};
    for (int64_t j = i; j < D; ++j) tail[j - i] = to_float(row[j]);
    const V v = O::load(tail);
    acc = O::fma(v, v, acc);
  }
  return O::hsum(acc);
}

// x [T, D] -> out [T, D] float32: x * (1 / sqrt(mean(x^2) + eps)), rows [begin, end)
template <class O, class T>
void rms_norm_rows(const T* x, int64_t D, float eps, float* out, int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const T* row = x + t * D;
    const float inv = 1.0f / std::sqrt(sum_of_squares<O>(row, D) / static_cast<float>(D) + eps);
    for (int64_t i = 0; i < D; ++i) out[t * D + i] = to_float(row[i]) * inv;
  }
}

// one row of V float32 logits: returns (max, sum of exp(x - max)); buf (when given) holds the exps
template <class O>
void exp_row(const float* x, int64_t V_, float* buf, float* max_out, float* sum_out) {
  using V = typename O::V;
  const float ninf = -std::numeric_limits<float>::infinity();
  V mx = O::set1(ninf);
  int64_t i = 0;
  for (; i + kLanes <= V_; i += kLanes) mx = O::max(mx, O::load(x + i));
  float m = O::hmax(mx);  // the max is exact in any order
  for (; i < V_; ++i) m = x[i] > m ? x[i] : m;
  V sum = O::zero();
  const V mv = O::set1(m);
  i = 0;
  for (; i + kLanes <= V_; i += kLanes) {
    const V e = vexp<O>(O::sub(O::load(x + i), mv));
    if (buf != nullptr) O::store(buf + i, e);
    sum = O::add(sum, e);
  }
  if (i < V_) {
    float tail[kLanes];
    for (int j = 0; j < kLanes; ++j) tail[j] = i + j < V_ ? x[i + j] : ninf;
    const V e = vexp<O>(O::sub(O::load(tail), mv));
    O::store(tail, e);
    if (buf != nullptr) std::copy(tail, tail + (V_ - i), buf + i);
    sum = O::add(sum, e);
  }
  *max_out = m;
  *sum_out = O::hsum(sum);
}

// logits [S, V] float32 -> out [S, V]: softmax (log_space false) or log-softmax, rows [begin, end)
template <class O>
void softmax_rows(const float* x, int64_t V_, bool log_space, float* out, int64_t begin, int64_t end) {
  using V = typename O::V;
  for (int64_t s = begin; s < end; ++s) {
    const float* row = x + s * V_;
    float* o = out + s * V_;
    float m, sum;
    exp_row<O>(row, V_, o, &m, &sum);
    // elementwise from here: each value's bits are the same in a vector lane or in the scalar tail
    const int64_t full = V_ / kLanes * kLanes;
    if (log_space) {
      const float log_sum = std::log(sum);
      for (int64_t i = 0; i < full; i += kLanes)
        O::store(o + i, O::sub(O::sub(O::load(row + i), O::set1(m)), O::set1(log_sum)));
      for (int64_t i = full; i < V_; ++i) o[i] = (row[i] - m) - log_sum;
    } else {
      for (int64_t i = 0; i < full; i += kLanes) O::store(o + i, O::div(O::load(o + i), O::set1(sum)));
      for (int64_t i = full; i < V_; ++i) o[i] = o[i] / sum;
    }
  }
}

// The index of x's first element for which hit(value) holds, or -1: whole chunks tested first (a loop
// the compiler vectorises), then the chunk that holds it element by element
template <class Hit>
int64_t first_index(const float* x, int64_t n, const Hit& hit) {
  constexpr int64_t kChunk = 64;
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t stop = std::min(n, c + kChunk);
    bool any = false;
    for (int64_t i = c; i < stop; ++i) any |= hit(x[i]);
    if (any)
      for (int64_t i = c; i < stop; ++i)
        if (hit(x[i])) return i;
  }
  return -1;
}

// logits [S, V] float32, rows [begin, end): the first index of each row's maximum (of its first NaN,
// as torch.argmax), and the two numbers of its log-softmax, max and log_sum (exp_row's, so that
// (x[i] - max) - log_sum is softmax_rows' log-space value of token i, bit for bit), without writing a row
template <class O>
void row_stats_rows(const float* x, int64_t V_, int64_t* argmax, float* max, float* log_sum, int64_t begin,
                    int64_t end) {
  for (int64_t s = begin; s < end; ++s) {
    const float* row = x + s * V_;
    float m, sum;
    exp_row<O>(row, V_, nullptr, &m, &sum);
    max[s] = m;
    log_sum[s] = std::log(sum);
    const int64_t nan = first_index(row, V_, [](float v) { return v != v; });
    argmax[s] = nan >= 0 ? nan : first_index(row, V_, [m](float v) { return v == m; });
  }
}

// gate_up [T, 2I] (gate | up) -> out [T, I] float32: act(gate) * up, act(g) = g / (1 + exp(-z)) with
// z = g (SiLU) or, when ``gelu``, z = 2 sqrt(2/pi) (g + 0.044715 g^3) (GELU's tanh form: 0.5 (1 + tanh(y))
// is 1 / (1 + exp(-2y)), so both gates share one exp)
template <class O, class T>
void silu_mul_rows(const T* gate_up, int64_t I, bool gelu, float* out, int64_t begin, int64_t end) {
  using V = typename O::V;
  const auto silu_mul = [gelu](V g, V u) {
    V z = g;
    if (gelu) z = O::mul(O::set1(1.5957691216057308f), O::add(g, O::mul(O::set1(0.044715f), O::mul(g, O::mul(g, g)))));
    return O::mul(O::div(g, O::add(O::set1(1.0f), vexp<O>(O::sub(O::zero(), z)))), u);
  };
  for (int64_t t = begin; t < end; ++t) {
    const T* gate = gate_up + t * 2 * I;
    const T* up = gate + I;
    float* o = out + t * I;
    int64_t i = 0;
    for (; i + kLanes <= I; i += kLanes) O::store(o + i, silu_mul(O::load(gate + i), O::load(up + i)));
    if (i < I) {  // the tail through zero-padded lanes: each lane computes as in a full vector
      float g[kLanes] = {0}, u[kLanes] = {0}, r[kLanes];
      for (int64_t j = i; j < I; ++j) {
        g[j - i] = to_float(gate[j]);
        u[j - i] = to_float(up[j]);
      }
      O::store(r, silu_mul(O::load(g), O::load(u)));
      std::copy(r, r + (I - i), o + i);
    }
  }
}

}  // namespace nxk
