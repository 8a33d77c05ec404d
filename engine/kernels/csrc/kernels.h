// The fixed-order kernels, written once over a vector struct O (vec.h) and compiled per instruction set.
//
// The order of every reduction is set here, never by a library, and depends on the row's own data
// and position alone, never on how many rows share the call or which thread computes them:
//   linear     y[m, n] = fma chain over k = 0, 1, ..., K-1, starting from 0 (one chain per output)
//   attention  per (query row, head): scores q.k in 8 lanes over head_dim then hsum; softmax over the
//              row's own keys (exact max, exp, lane sums in key order); p.v as one fma chain per output
//              dimension over keys in position order. Keys are read in place from the paged cache.
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

// ---- attention over the paged cache, read in place ----

// T: the queries' type; C: the cache's (T, or float16 under float32 queries: read widened, exactly)
template <class T, class C = T>
struct AttentionArgs {
  const T* q;               // [rows, heads, d]
  const C* k_cache;         // [blocks, kv_heads, block, d]
  const C* v_cache;         // [blocks, kv_heads, block, d]
  const int64_t* tables;    // [R, table_width]: each request's block table
  int64_t table_width;
  const int64_t* owners;    // [rows]: the request (row of tables) each query row belongs to
  const int64_t* positions; // [rows]: each query row's position; it sees keys 0..position (causal)
  int64_t heads, kv_heads, d, block;
  float scale;
  int64_t window;           // > 0: sees only the last `window` positions (sliding window)
  float softcap;            // > 0: scores become softcap * tanh(score / softcap)
  float* out;               // [rows, heads, d] float32
};

// For HP heads of one KV group at once, out_h[0 .. N vectors) = sum over keys j in position order of
// p_h[j] * v[key_at[j] ..], one fma chain per (head, output lane), then / total_h: each chain is the
// one a head alone would run, but every V row is loaded once for the HP heads (a group's heads read the
// same values; loading them once per head made the value pass wait on L2). p: head h's weights at
// p + h * p_stride; out: head h's output at out + h * out_stride. HP * N accumulators stay in registers.
template <class O, class T, int HP, int N>
void weighted_values(const float* p, int64_t p_stride, const int64_t* key_at, int64_t L, const T* v,
                     const float* total, float* out, int64_t out_stride) {
  using V = typename O::V;
  V acc[HP][N];
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) acc[h][t] = O::zero();
  for (int64_t j = 0; j < L; ++j) {
    const T* vp = v + key_at[j];
    V pj[HP];
    for (int h = 0; h < HP; ++h) pj[h] = O::set1(p[h * p_stride + j]);
    for (int t = 0; t < N; ++t) {
      const V vt = O::load(vp + t * kLanes);
      for (int h = 0; h < HP; ++h) acc[h][t] = O::fma(pj[h], vt, acc[h][t]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) O::store(out + h * out_stride + t * kLanes, O::div(acc[h][t], O::set1(total[h])));
}

constexpr int kValueAccumulators = 12;  // HP heads x N vectors of accumulators per value pass (16 registers)
constexpr int kMostValueVectors = 12;   // N at most, at any width (value_pieces' cases)

// A decode row's keys live in other requests' pages than the last row's, so they come from memory, in
// blocks of a few KB: too short for the hardware's prefetchers, and one key at a time keeps few lines in
// flight. The scores pass asks for the K and V rows of the keys kKeysAhead ahead into L1 (V is read
// again soon after, by the value pass), of those kKeysAheadL2 ahead into L2, and of the next item's keys
// into L2. On smollm2's decode steps (KV pools of 30 layers, 13 rows of 150-600 keys) attention read
// ~10 GB/s with the first alone and ~14-16 GB/s with all three (one process alternating them).
constexpr int64_t kKeysAhead = 16;
constexpr int64_t kKeysAheadL2 = 64;

// The K and V rows of the key at ``at``: into L1 (Locality 3), or into L2 only (2: keys far ahead, so
// L1 keeps the ones about to be read)
template <int Locality = 3, class T, class C>
void prefetch_key(const AttentionArgs<T, C>& a, int64_t at) {
  for (int64_t i = 0; i < a.d; i += 64 / static_cast<int64_t>(sizeof(C))) {
    __builtin_prefetch(a.k_cache + at + i, 0, Locality);
    __builtin_prefetch(a.v_cache + at + i, 0, Locality);
  }
}

// The offset in the cache of each key item (row, KV head) sees, in position order: the same for K and V
template <class T, class C>
void item_keys(const AttentionArgs<T, C>& a, int64_t item, std::vector<int64_t>& key_at) {
  const int64_t row = item / a.kv_heads, g = item % a.kv_heads;
  const int64_t pos = a.positions[row];
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  const int64_t* table = a.tables + a.owners[row] * a.table_width;
  key_at.resize(pos - first + 1);
  for (int64_t j = 0, b = first / a.block, off = first % a.block; j < static_cast<int64_t>(key_at.size()); ++j) {
    key_at[j] = ((table[b] * a.kv_heads + g) * a.block + off) * a.d;  // no division per key
    if (++off == a.block) off = 0, ++b;
  }
}

// Scores of HG heads (queries at q + h * d) against eight keys (kp[u]): dot[h][u] is the vector of head
// h's fma chain with key u over head_dim, t = 0 .. d / kLanes - 1 in order, as one head alone would run
// it. Four keys at a time, so each key's vector is loaded (and widened from float16) once for the HG
// heads instead of once per head: 4 HG accumulators and 4 key vectors fit the 16 AVX2 registers.
constexpr int kKeyDotHeads = 3;
template <class O, class C, int HG>
void key_dots(const float* q, int64_t d, const C* const* kp, typename O::V (*dot)[kLanes]) {
  using V = typename O::V;
  static_assert(HG <= kKeyDotHeads && kLanes % 4 == 0);
  for (int u0 = 0; u0 < kLanes; u0 += 4) {
    V acc[HG][4];
    for (int h = 0; h < HG; ++h)
      for (int i = 0; i < 4; ++i) acc[h][i] = O::zero();
    for (int64_t c = 0; c < d; c += kLanes) {
      V key[4];
      for (int i = 0; i < 4; ++i) key[i] = O::load(kp[u0 + i] + c);
      for (int h = 0; h < HG; ++h) {
        const V qv = O::load(q + h * d + c);
        for (int i = 0; i < 4; ++i) acc[h][i] = O::fma(qv, key[i], acc[h][i]);
      }
    }
    for (int h = 0; h < HG; ++h)
      for (int i = 0; i < 4; ++i) dot[h][u0 + i] = acc[h][i];
  }
}

// The pieces of one item's value pass: up to four heads of the group at a time, by as many vectors of
// `lanes` output dimensions as Accumulators registers hold for those heads (kMostValueVectors at most);
// each piece is pass(heads, vectors, p, v, totals, out) with heads and vectors std::integral_constants,
// p and totals at the piece's first head, v and out at its first dimension.
template <int Accumulators, class C, class Pass>
void value_pieces(int64_t lanes, int64_t group, int64_t d, const float* p, int64_t p_stride, const C* v_cache,
                  const float* totals, float* out, Pass&& pass) {
  const int64_t nv = d / lanes;
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    const int64_t hp = std::min<int64_t>(4, group - h0);
    const int64_t width = std::min<int64_t>(kMostValueVectors, Accumulators / hp);
    for (int64_t c = 0; c < nv; c += width) {
      const int64_t n = std::min(width, nv - c);
      const auto piece = [&](auto heads) {
        const auto call = [&](auto vectors) {
          pass(heads, vectors, p + h0 * p_stride, v_cache + c * lanes, totals + h0, out + h0 * d + c * lanes);
        };
        switch (n) {
#define NXK_VECTORS(k)                                                                          \
  case k:                                                                                       \
    if constexpr (decltype(heads)::value * k <= Accumulators) call(std::integral_constant<int, k>{}); \
    break;
          NXK_VECTORS(12) NXK_VECTORS(11) NXK_VECTORS(10) NXK_VECTORS(9) NXK_VECTORS(8) NXK_VECTORS(7)
          NXK_VECTORS(6) NXK_VECTORS(5) NXK_VECTORS(4) NXK_VECTORS(3) NXK_VECTORS(2)
#undef NXK_VECTORS
          default: call(std::integral_constant<int, 1>{}); break;
        }
      };
      switch (hp) {
        case 4: piece(std::integral_constant<int, 4>{}); break;
        case 3: piece(std::integral_constant<int, 3>{}); break;
        case 2: piece(std::integral_constant<int, 2>{}); break;
        default: piece(std::integral_constant<int, 1>{}); break;
      }
    }
  }
}

// The two passes of one item, over 8-lane vectors: ``scores`` is key_dots; ``values`` gives out [group, d],
// each head's weights p (head h at p + h * p_stride) over the V rows at key_at, / its total (value_pieces
// of weighted_values). A table may bring wider passes (isa_avx512_attention.cpp) that run the same chains.
struct EightLanePasses {
  static constexpr bool kPairRows = false;  // one row at a time (16 registers hold no pair)

  template <class O, class C, int HG>
  static void scores(const float* q, int64_t d, const C* const* kp, typename O::V (*dot)[kLanes]) {
    key_dots<O, C, HG>(q, d, kp, dot);
  }

  template <class O, class C>
  static void values(int64_t group, int64_t d, const float* p, int64_t p_stride, const int64_t* key_at, int64_t L,
                     const C* v_cache, const float* totals, float* out) {
    value_pieces<kValueAccumulators>(
        kLanes, group, d, p, p_stride, v_cache, totals, out,
        [&](auto heads, auto vectors, const float* ph, const C* v, const float* tot, float* o) {
          constexpr int HP = decltype(heads)::value, N = decltype(vectors)::value;
          weighted_values<O, C, HP, N>(ph, p_stride, key_at, L, v, tot, o, d);
        });
  }
};

// The scores of one vector of keys for one head: its dots' horizontal sums (O::hsum8, each lane the
// order of O::hsum), scaled (and softcapped), at sh; lanes from nk on are padding, -inf (exp gives 0)
template <class O, class T, class C>
void store_scores(const AttentionArgs<T, C>& a, const typename O::V* dot, int64_t nk, float* sh) {
  O::store(sh, O::mul(O::hsum8(dot), O::set1(a.scale)));
  if (a.softcap > 0.0f)
    for (int64_t u = 0; u < nk; ++u) sh[u] = a.softcap * std::tanh(sh[u] / a.softcap);
  for (int64_t u = nk; u < kLanes; ++u) sh[u] = -std::numeric_limits<float>::infinity();
}

// Each head's scores (head h's Lp at scores + h * Lp, padding -inf) in place of their exps (of
// score - max: the max is exact in any order, and only subtracted), totals[h] their lane sums' hsum
template <class O>
void exps_of_scores(float* scores, int64_t group, int64_t Lp, float* totals) {
  using V = typename O::V;
  for (int64_t h = 0; h < group; ++h) {
    float* s = scores + h * Lp;
    V mv = O::set1(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < Lp; j += kLanes) mv = O::max(O::load(s + j), mv);
    const float m = O::hmax(mv);
    V sum = O::zero();
    for (int64_t j = 0; j < Lp; j += kLanes) {
      const V e = vexp<O>(O::sub(O::load(s + j), O::set1(m)));
      O::store(s + j, e);
      sum = O::add(sum, e);
    }
    totals[h] = O::hsum(sum);
  }
}

// One row's query heads (of one KV group) as floats, their scores and their softmax totals
struct ItemScratch {
  ItemScratch(int64_t group, int64_t d) : qf(group * d), totals(group) {}
  std::vector<float> qf, scores, totals;

  // Takes row's query heads of KV head g as floats; scores holds Lp (whole vectors of) keys per head
  template <class T, class C>
  void start(const AttentionArgs<T, C>& a, int64_t row, int64_t g, int64_t Lp) {
    const int64_t group = a.heads / a.kv_heads;
    const T* qrow = a.q + (row * a.heads + g * group) * a.d;
    for (int64_t i = 0; i < group * a.d; ++i) qf[i] = to_float(qrow[i]);
    scores.resize(group * Lp);
  }
};

// The keys' vector from j0 (of L, at key_at) into kp (past L the last key again, padding), with the
// near prefetch into L1 kKeysAhead keys on (the first vector also prefetches the first kKeysAhead)
template <class T, class C>
void near_keys(const AttentionArgs<T, C>& a, const std::vector<int64_t>& key_at, int64_t j0, int64_t L, const C** kp) {
  if (j0 == 0)
    for (int64_t j = 0; j < std::min(L, kKeysAhead); ++j) prefetch_key(a, key_at[j]);
  for (int64_t j = j0 + kKeysAhead; j < std::min(L, j0 + kKeysAhead + kLanes); ++j) prefetch_key(a, key_at[j]);
  const int64_t nk = std::min<int64_t>(kLanes, L - j0);
  for (int64_t u = 0; u < kLanes; ++u) kp[u] = a.k_cache + key_at[j0 + std::min(u, nk - 1)];
}

// fn(heads) for the heads [h, h + kKeyDotHeads) of a group of ``group``, heads an std::integral_constant
// (fewer at the group's end): one score pass's heads
template <class F>
void by_score_heads(int64_t h, int64_t group, const F& fn) {
  switch (std::min<int64_t>(kKeyDotHeads, group - h)) {
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    default: fn(std::integral_constant<int, 1>{}); break;
  }
}

// Two rows of one request at consecutive positions (a prefill chunk's neighbours), KV head g, for passes
// that take pairs (Passes::kPairRows): the second row sees the first's keys and one more; each key
// vector's load and widening serve both rows' score chains, each V vector both rows' value chains. Each
// row's chains are its own, so its bits are those of the row alone. key_at: scratch for the keys.
template <class O, class T, class C, class Passes>
void attention_pair(const AttentionArgs<T, C>& a, int64_t row, int64_t g, ItemScratch& first, ItemScratch& second,
                    std::vector<int64_t>& key_at) {
  using V = typename O::V;
  const int64_t group = a.heads / a.kv_heads, d = a.d;
  item_keys(a, (row + 1) * a.kv_heads + g, key_at);  // the second row's: the first's and one more
  const int64_t L1 = static_cast<int64_t>(key_at.size()), L0 = L1 - 1;
  const int64_t Lp0 = (L0 + kLanes - 1) / kLanes * kLanes, Lp1 = (L1 + kLanes - 1) / kLanes * kLanes;
  first.start(a, row, g, Lp0);
  second.start(a, row + 1, g, Lp1);
  for (int64_t j0 = 0; j0 < L1; j0 += kLanes) {
    const int64_t nk1 = std::min<int64_t>(kLanes, L1 - j0), nk0 = std::min<int64_t>(kLanes, L0 - j0);
    const C* kp[kLanes];
    near_keys(a, key_at, j0, L1, kp);
    V dots0[kKeyDotHeads][kLanes], dots1[kKeyDotHeads][kLanes];
    for (int64_t h = 0; h < group; ++h) {
      if (h % kKeyDotHeads == 0)
        by_score_heads(h, group, [&](auto heads) {
          Passes::template scores_pair<O, C, decltype(heads)::value>(first.qf.data() + h * d, second.qf.data() + h * d,
                                                                     d, kp, dots0, dots1);
        });
      // the first row's lanes past its own keys (the second's last key) are its padding
      if (nk0 > 0) store_scores<O>(a, dots0[h % kKeyDotHeads], nk0, first.scores.data() + h * Lp0 + j0);
      store_scores<O>(a, dots1[h % kKeyDotHeads], nk1, second.scores.data() + h * Lp1 + j0);
    }
  }
  exps_of_scores<O>(first.scores.data(), group, Lp0, first.totals.data());
  exps_of_scores<O>(second.scores.data(), group, Lp1, second.totals.data());
  Passes::template values_pair<O, C>(group, d, first.scores.data(), Lp0, second.scores.data(), Lp1, key_at.data(), L0,
                                     a.v_cache, first.totals.data(), second.totals.data(),
                                     a.out + (row * a.heads + g * group) * d, a.out + ((row + 1) * a.heads + g * group) * d);
}

// work items [begin, end) of rows * kv_heads: one query row and one KV head (its group of query heads);
// Passes: the score and value passes (EightLanePasses, or a table's wider ones). A table whose passes
// take two rows (Passes::kPairRows) runs a prefill chunk's neighbours, rows of one request at
// consecutive positions, as a pair per KV head: each key's and value's load and widening serve both,
// and each row's chains (scores over head_dim, softmax, values over its own keys) are its own, so the
// bits are those of the rows alone.
template <class O, class T, class C = T, class Passes = EightLanePasses>
void attention_items(const AttentionArgs<T, C>& a, int64_t begin, int64_t end) {
  using V = typename O::V;
  const int64_t group = a.heads / a.kv_heads, d = a.d;
  ItemScratch first(group, d), second(group, d);  // one row's (a pair: the first row's), a pair's second row's
  std::vector<int64_t> key_at, next_at;  // the keys of this item and of the next (item_keys)
  int64_t next_item = -1;                // the item next_at holds the keys of
  // only keys no earlier row of this call has read come from memory (a prefill chunk's later rows
  // find theirs in cache): the far prefetches are for those
  const auto first_of_request = [&a](int64_t r) { return r == 0 || a.owners[r - 1] != a.owners[r]; };
  for (int64_t item = begin; item < end;) {
    const int64_t row = item / a.kv_heads, g = item % a.kv_heads;
    if constexpr (Passes::kPairRows) {
      // a prefill chunk's row and the next, whole rows of this range: every KV head as a pair
      if (g == 0 && item + 2 * a.kv_heads <= end && a.window == 0 && !first_of_request(row) &&
          a.owners[row + 1] == a.owners[row] && a.positions[row + 1] == a.positions[row] + 1) {
        for (int64_t kv = 0; kv < a.kv_heads; ++kv) attention_pair<O, T, C, Passes>(a, row, kv, first, second, key_at);
        item += 2 * a.kv_heads;
        continue;
      }
    }
    if (next_item == item) {
      std::swap(key_at, next_at);
    } else {
      item_keys(a, item, key_at);
    }
    // the next item's keys, for the far prefetch into L2 when its row is a request's first
    const bool next_far = item + 1 < end && first_of_request((item + 1) / a.kv_heads);
    if (next_far) item_keys(a, item + 1, next_at);
    next_item = next_far ? item + 1 : -1;
    const int64_t L = static_cast<int64_t>(key_at.size()), Lp = (L + kLanes - 1) / kLanes * kLanes;
    const int64_t far_L = first_of_request(row) ? L : 0;
    const int64_t next_L = next_far ? static_cast<int64_t>(next_at.size()) : 0;
    first.start(a, row, g, Lp);
    // scores: keys eight at a time, so eight independent fma chains are in flight and their eight
    // horizontal sums are one transposed reduction; each key's own chain over head_dim is the same
    // whichever keys share its group
    for (int64_t j0 = 0; j0 < L; j0 += kLanes) {
      const int64_t nk = std::min<int64_t>(kLanes, L - j0);
      const C* kp[kLanes];
      near_keys(a, key_at, j0, L, kp);
      // into L2: this item's keys kKeysAheadL2 ahead, and the next item's spread over this score pass
      for (int64_t j = j0 + kKeysAheadL2; j < std::min(far_L, j0 + kKeysAheadL2 + kLanes); ++j)
        prefetch_key<2>(a, key_at[j]);
      for (int64_t j = j0 * next_L / L, stop = std::min(L, j0 + kLanes) * next_L / L; j < stop; ++j)
        prefetch_key<2>(a, next_at[j]);
      V dots[kKeyDotHeads][kLanes];
      for (int64_t h = 0; h < group; ++h) {
        if (h % kKeyDotHeads == 0)
          by_score_heads(h, group, [&](auto heads) {
            Passes::template scores<O, C, decltype(heads)::value>(first.qf.data() + h * d, d, kp, dots);
          });
        // Lp is whole vectors, so the store stays in the row
        store_scores<O>(a, dots[h % kKeyDotHeads], nk, first.scores.data() + h * Lp + j0);
      }
    }
    exps_of_scores<O>(first.scores.data(), group, Lp, first.totals.data());
    Passes::template values<O, C>(group, d, first.scores.data(), Lp, key_at.data(), L, a.v_cache,
                                  first.totals.data(), a.out + (row * a.heads + g * group) * d);
    ++item;
  }
}

}  // namespace nxk
