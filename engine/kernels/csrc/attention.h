// Attention over the paged cache, read in place, with every reduction in an order set by positions alone.
//
// Keys are taken in spans of kSpan positions, [0, 256), [256, 512), ...: the same spans for a row of a
// prefill chunk and for a decode step at that position, whatever else the call holds, however the
// prompt was chunked and whichever thread runs it. For each query row and head, span by span:
//   scores   s_j = (fma chain over head_dim, c = 0 .. d-1, of q[c] * k_j[c], from 0) * scale, one chain per
//            key (then softcap * tanh(s_j / softcap) where a softcap is set)
//   max      m' = max(m, the span's exact max)                                   (m starts at -inf)
//   weights  p_j = exp(s_j - m') (vexp); the span's total: 16 partial sums, sum i adding p_j of the keys
//            j = i, i + 16, i + 32, ... of the span in position order, then sums i and i + 8 added, then
//            O::hsum of those eight
//   running  alpha = exp(m - m') (1 where m' = m); l = fma(l, alpha, total); acc = acc * alpha, then
//            acc = fma(p_j, v_j, acc) for each key j of the span in position order (one chain per dimension)
// and out = acc / l. Each step is one IEEE operation per lane and lanes never mix but in O::hsum, so
// any vector width gives the same bits: the AVX-512 passes (16 keys or dimensions a vector), the AVX2
// and generic builds; the cross-instruction-set tests compare them.
//
// Work: a tile is a run of up to kTileRows rows of one request at consecutive positions (a prefill
// chunk's rows; a decode row is a tile of one), and each (tile, KV head) is one item. A span's keys are
// widened and transposed once per item (head_dim-major, keys side by side) and serve the scores of every
// row and head of the tile; its V rows are read in place. A row reads only its own keys' scores, so its
// bits never depend on its tile.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "kv_int8.h"
#include "vec.h"

namespace nxk {

constexpr int64_t kSpan = 256;     // key positions per span: spans start at multiples of kSpan
constexpr int64_t kTileRows = 32;
// the row stride of the span buffers (kt, scores): a span and one line more, so that a column of rows does
// not fall into a handful of L1 sets (rows 1 KB apart would share every fourth set)
constexpr int64_t kSpanStride = kSpan + 16;  // rows of one request whose scores share a span's transposed keys

// T: the queries' type; C: the cache's (T, or under float32 queries float16 or int8 (kv_int8.h): read
// widened, exactly)
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
  bool keys_by_dimension = false;  // K as [blocks, kv_heads, d, block] (cache_layout.h); V is always by row
  const Half* k_scales = nullptr;  // an int8 cache's scales (kv_int8.h), laid out as K
  const Half* v_scales = nullptr;  //   and as V
};

// Rows [row, row + rows) of one request, at consecutive positions
struct AttentionTile {
  int64_t row, rows;
};

// The tiles of a call's rows: each run of rows of one request at consecutive positions, cut every kTileRows
template <class T, class C>
std::vector<AttentionTile> attention_tiles(const AttentionArgs<T, C>& a, int64_t rows) {
  std::vector<AttentionTile> tiles;
  for (int64_t r = 0; r < rows;) {
    int64_t n = 1;
    while (n < kTileRows && r + n < rows && a.owners[r + n] == a.owners[r] &&
           a.positions[r + n] == a.positions[r + n - 1] + 1)
      ++n;
    tiles.push_back({r, n});
    r += n;
  }
  return tiles;
}

// One item's working memory (nq = the tile's rows x the group's heads): reused from item to item
struct SpanScratch {
  std::vector<float> qf;      // [nq, d] the queries as floats
  std::vector<float> kt;      // [d, kSpanStride] the span's keys, widened, key j of the span at column j
  std::vector<float> scores;  // [nq, kSpanStride] scores, then weights
  std::vector<float> acc;     // [nq, d] the running weighted values
  std::vector<float> m, l, alpha;  // [nq] running max, running total, this span's rescale
  std::vector<int64_t> key_at;     // [kSpan] the cache offset of each span key (-1: outside the tile's keys)
  std::vector<int64_t> k_at;       // [kSpan] where each span key's K values start (its V row's offset, by row)
  std::vector<int64_t> following;  // the head-block offsets of the next item's first blocks (prefetched)
  std::vector<float> vw;           // [kSpan, d] the span's V rows widened to float (tiles of several rows)
  std::vector<int64_t> vw_at;      // [kSpan] the offset of each span key's row in vw

  void start(int64_t nq, int64_t d) {
    qf.resize(nq * d);
    kt.resize(d * kSpanStride);
    scores.resize(nq * kSpanStride);
    acc.assign(nq * d, 0.0f);
    m.assign(nq, -std::numeric_limits<float>::infinity());
    l.assign(nq, 0.0f);
    alpha.resize(nq);
    key_at.resize(kSpan);
    k_at.resize(kSpan);
    if (static_cast<int64_t>(vw_at.size()) != kSpan || (d > 0 && vw_at[1] != d)) {  // the offsets for this d
      vw_at.resize(kSpan);
      for (int64_t j = 0; j < kSpan; ++j) vw_at[j] = j * d;
    }
    vw.resize(kSpan * d);
  }
};

constexpr int kValueAccumulators = 12;  // HP heads x N vectors of accumulators per value pass (16 registers)
constexpr int kMostValueVectors = 12;   // N at most, at any width (value_pieces' cases)

// The pieces of one row's value pass: up to four heads of the group at a time, by as many vectors of
// `lanes` output dimensions as Accumulators registers hold for those heads (kMostValueVectors at most);
// each piece is pass(heads, vectors, p, v, alpha, out) with heads and vectors std::integral_constants,
// p and alpha at the piece's first head, v and out at its first dimension.
template <int Accumulators, class C, class Pass>
void value_pieces(int64_t lanes, int64_t group, int64_t d, const float* p, int64_t p_stride, const C* v_cache,
                  const float* alpha, float* out, Pass&& pass) {
  const int64_t nv = d / lanes;
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    const int64_t hp = std::min<int64_t>(4, group - h0);
    const int64_t width = std::min<int64_t>(kMostValueVectors, Accumulators / hp);
    for (int64_t c = 0; c < nv; c += width) {
      const int64_t n = std::min(width, nv - c);
      const auto piece = [&](auto heads) {
        const auto call = [&](auto vectors) {
          pass(heads, vectors, p + h0 * p_stride, v_cache + c * lanes, alpha + h0, out + h0 * d + c * lanes);
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

// exp(x) for one value, as vexp computes each lane
template <class O>
float exp_one(float x) {
  float lanes[kLanes];
  O::store(lanes, vexp<O>(O::set1(x)));
  return lanes[0];
}

// Where an int8 V cache's scales are (kv_int8.h), for a value pass over dimensions from dim0 of rows d long
// (float caches: none, never read)
struct ValueScales {
  const Half* at = nullptr;
  int64_t d = 0, dim0 = 0;
  // the scales of the row at offset `row_at` (its groups in order)
  const Half* row(int64_t row_at) const { return at + row_scale_at(row_at, d, 0); }
  // the index in row()'s scales of the pass's value c
  int64_t group(int64_t c) const { return (dim0 + c) / kKvGroup; }
};

// A cache's kLanes values at p as floats: as they are, widened, or (int8) times their group's scale s
template <class O, class C>
typename O::V load_scaled(const C* p, float s) {
  if constexpr (std::is_same_v<C, int8_t>)
    return O::mul(O::load_i8(p), O::set1(s));
  else
    return O::load(p);
}

// For HP heads of one row, acc_h = acc_h * alpha_h, then acc_h = fma(p_h[j], v_j, acc_h) for the L keys at
// key_at in order: one chain per (head, output lane); every V vector is loaded once for the HP heads (an
// int8 row's values as q * s: the values a float32 cache of them holds)
template <class O, class C, int HP, int N>
[[gnu::noinline]] void span_values(const float* p, int64_t p_stride, const int64_t* key_at, int64_t L, const C* v, const float* alpha,
                 float* acc, int64_t acc_stride, ValueScales scales) {
  using V = typename O::V;
  V a[HP][N];
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) a[h][t] = O::mul(O::load(acc + h * acc_stride + t * kLanes), O::set1(alpha[h]));
  for (int64_t j = 0; j < L; ++j) {
    const C* vp = v + key_at[j];
    V pj[HP];
    for (int h = 0; h < HP; ++h) pj[h] = O::set1(p[h * p_stride + j]);
    // an int8 row's scales (found once per key), the one of the group vector t falls in widened once per group
    const Half* row_scales = std::is_same_v<C, int8_t> ? scales.row(key_at[j]) : nullptr;
    float s = 1.0f;
    for (int t = 0; t < N; ++t) {
      if constexpr (std::is_same_v<C, int8_t>)
        if (t == 0 || (scales.dim0 + t * kLanes) % kKvGroup == 0) s = to_float(row_scales[scales.group(t * kLanes)]);
      const V vt = load_scaled<O>(vp + t * kLanes, s);
      for (int h = 0; h < HP; ++h) a[h][t] = O::fma(pj[h], vt, a[h][t]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int t = 0; t < N; ++t) O::store(acc + h * acc_stride + t * kLanes, a[h][t]);
}

// QB query vectors' scores against KB vectors of keys (kt: head_dim-major, kt_stride between dimensions)
template <class O, int QB, int KB>
[[gnu::noinline]] void score_block(const float* qf, int64_t d, const float* kt, int64_t kt_stride, float scale, float* sc,
                 int64_t sc_stride) {
  using V = typename O::V;
  V acc[QB][KB];
  for (int i = 0; i < QB; ++i)
    for (int b = 0; b < KB; ++b) acc[i][b] = O::zero();
  for (int64_t c = 0; c < d; ++c) {
    V k[KB];
    for (int b = 0; b < KB; ++b) k[b] = O::load(kt + c * kt_stride + b * kLanes);
    for (int i = 0; i < QB; ++i) {
      const V qv = O::set1(qf[i * d + c]);
      for (int b = 0; b < KB; ++b) acc[i][b] = O::fma(qv, k[b], acc[i][b]);
    }
  }
  for (int i = 0; i < QB; ++i)
    for (int b = 0; b < KB; ++b) O::store(sc + i * sc_stride + b * kLanes, O::mul(acc[i][b], O::set1(scale)));
}

// QB query vectors' scores against one vector of keys read in place: key u's value at dimension c at
// k + c * step + u (a block's keys side by side, by dimension): score_block's chains. An int8 cache's keys
// are read as q * s, key u's scale of group g at ks[g * step + u] (kv_int8.h)
template <class O, int QB, class C>
[[gnu::noinline]] void direct_score_block(const float* qf, int64_t d, const C* k, int64_t step, float scale, float* sc,
                                          int64_t sc_stride, const Half* ks) {
  using V = typename O::V;
  constexpr bool kInt8 = std::is_same_v<C, int8_t>;
  V acc[QB];
  for (int i = 0; i < QB; ++i) acc[i] = O::zero();
  for (int64_t c0 = 0; c0 < d; c0 += kInt8 ? kKvGroup : d) {
    V s = O::zero();
    if constexpr (kInt8) s = O::load(ks + c0 / kKvGroup * step);
    for (int64_t c = c0; c < std::min(d, c0 + (kInt8 ? kKvGroup : d)); ++c) {
      V kv;
      if constexpr (kInt8)
        kv = O::mul(O::load_i8(k + c * step), s);
      else
        kv = O::load(k + c * step);
      for (int i = 0; i < QB; ++i) acc[i] = O::fma(O::set1(qf[i * d + c]), kv, acc[i]);
    }
  }
  for (int i = 0; i < QB; ++i) O::store(sc + i * sc_stride, O::mul(acc[i], O::set1(scale)));
}

// fn(std::integral_constant<int, n>{}) for n = min(left, Most) in [1, Most]: a block loop's tail
template <int Most, class F>
void by_count(int64_t left, const F& fn) {
  if constexpr (Most > 1) {
    if (left >= Most) return fn(std::integral_constant<int, Most>{});
    return by_count<Most - 1>(left, fn);
  } else {
    fn(std::integral_constant<int, 1>{});
  }
}

// A span's weights are summed over vectors of this many keys (aligned at multiples of it): 16 partial sums
constexpr int64_t kTotalVector = 16;

// sc[j] = -inf for j in [a, lo) and [hi, b), the whole kTotalVector-key vectors around [lo, hi); returns a
inline int64_t mask_outside(float* sc, int64_t lo, int64_t hi) {
  const int64_t a = lo / kTotalVector * kTotalVector, b = (hi + kTotalVector - 1) / kTotalVector * kTotalVector;
  for (int64_t j = a; j < lo; ++j) sc[j] = -std::numeric_limits<float>::infinity();
  for (int64_t j = hi; j < b; ++j) sc[j] = -std::numeric_limits<float>::infinity();
  return a;
}

// The passes of a span over kLanes-wide vectors (the generic and AVX2 builds): keys widened (transpose),
// their scores (scores, or scores_in_place for a decode row), the weights and the values. A table may
// bring wider ones (isa_avx512_attention.cpp) that compute the same chains.
struct EightLanePasses {
  static constexpr int64_t kKeyVector = kLanes;  // span keys are handled in whole vectors of this many

  // kt[c * stride + i] = key i's value at dimension c, widened (0 where k_at[i] < 0), i < n: key i's values
  // at k_at[i] + c * step (step 1 by row; the block size by dimension, where a block's keys at one
  // dimension are side by side: whole vectors of them are copied as they are)
  template <class O, class C>
  static void transpose(const C* cache, const int64_t* k_at, int64_t n, int64_t d, int64_t step, float* kt,
                        int64_t stride) {
    for (int64_t i = 0; i < n; ++i) {
      if (step > 1 && i % kLanes == 0 && i + kLanes <= n && k_at[i] >= 0 && k_at[i + kLanes - 1] == k_at[i] + kLanes - 1) {
        for (int64_t c = 0; c < d; ++c) O::store(kt + c * stride + i, O::load(cache + k_at[i] + c * step));
        i += kLanes - 1;
        continue;
      }
      for (int64_t c = 0; c < d; ++c) kt[c * stride + i] = k_at[i] < 0 ? 0.0f : to_float(cache[k_at[i] + c * step]);
    }
  }

  // sc[q * sc_stride + j] = (q's chain with key j) * scale, for nq query vectors and n keys (whole vectors)
  template <class O>
  static void scores(const float* qf, int64_t nq, int64_t d, const float* kt, int64_t kt_stride, int64_t n, float scale,
                     float* sc, int64_t sc_stride) {
    constexpr int kQueries = 4, kKeys = 2;  // 8 accumulators, 2 keys and a query of the 16 AVX2 registers
    // keys outer: a block of keys' transposed values stays in L1 while every query takes its scores
    for (int64_t j = 0; j < n; j += kKeys * kLanes)
      by_count<kKeys>((n - j) / kLanes, [&](auto keys) {
        for (int64_t q0 = 0; q0 < nq; q0 += kQueries)
          by_count<kQueries>(nq - q0, [&](auto queries) {
            score_block<O, decltype(queries)::value, decltype(keys)::value>(qf + q0 * d, d, kt + j, kt_stride, scale,
                                                                           sc + q0 * sc_stride + j, sc_stride);
          });
      });
  }

  // One row's span update for one head (the header's order): sc holds the scores of keys [lo, hi) of the
  // span (local), the rest of the row's whole kTotalVector-key vectors is masked; the scores become weights
  template <class O>
  static void weights(float* sc, int64_t lo, int64_t hi, float& m, float& l, float& alpha) {
    using V = typename O::V;
    const int64_t a = mask_outside(sc, lo, hi), b = (hi + kTotalVector - 1) / kTotalVector * kTotalVector;
    V mv = O::set1(-std::numeric_limits<float>::infinity());
    for (int64_t j = a; j < b; j += kLanes) mv = O::max(O::load(sc + j), mv);
    const float m_new = std::max(m, O::hmax(mv));
    alpha = m_new == m ? 1.0f : exp_one<O>(m - m_new);
    const V mn = O::set1(m_new);
    V low = O::zero(), high = O::zero();  // lanes 0-7 and 8-15 of each 16-key vector
    for (int64_t j = a; j < b; j += kTotalVector) {
      const V e0 = vexp<O>(O::sub(O::load(sc + j), mn)), e1 = vexp<O>(O::sub(O::load(sc + j + kLanes), mn));
      O::store(sc + j, e0);
      O::store(sc + j + kLanes, e1);
      low = O::add(low, e0);
      high = O::add(high, e1);
    }
    l = std::fma(l, alpha, O::hsum(O::add(low, high)));
    m = m_new;
  }

  // scores() of n keys (by dimension, step apart) read in place where a whole vector of them is one run of a
  // block's keys, else through transpose() into kt (a decode row: no keys to share, so no copy to make); an
  // int8 cache's keys with their scales (kv_int8.h)
  template <class O, class C>
  static void scores_in_place(const float* qf, int64_t nq, int64_t d, const C* cache, const int64_t* k_at, int64_t n,
                              int64_t step, float scale, float* kt, int64_t kt_stride, float* sc, int64_t sc_stride,
                              const Half* k_scales) {
    constexpr int kQueries = 4;
    for (int64_t u = 0; u < n; u += kLanes) {
      if (k_at[u] < 0 || k_at[u + kLanes - 1] != k_at[u] + kLanes - 1) {
        widen_keys<O>(cache, k_scales, k_at + u, kLanes, d, step, kt + u, kt_stride);
        scores<O>(qf, nq, d, kt + u, kt_stride, kLanes, scale, sc + u, sc_stride);
        continue;
      }
      const Half* ks = std::is_same_v<C, int8_t> ? k_scales + column_scale_at(k_at[u], d, step, 0) : nullptr;
      for (int64_t q0 = 0; q0 < nq; q0 += kQueries)
        by_count<kQueries>(nq - q0, [&](auto queries) {
          direct_score_block<O, decltype(queries)::value>(qf + q0 * d, d, cache + k_at[u], step, scale,
                                                          sc + q0 * sc_stride + u, sc_stride, ks);
        });
    }
  }

  // transpose() for the keys of a decode row by dimension (step the block size), an int8 cache's as q * s
  template <class O, class C>
  static void widen_keys(const C* cache, const Half* k_scales, const int64_t* k_at, int64_t n, int64_t d,
                         int64_t step, float* kt, int64_t stride) {
    if constexpr (std::is_same_v<C, int8_t>)
      dequantize_keys<O>(cache, k_scales, k_at, n, d, step, true, kt, stride);
    else
      transpose<O>(cache, k_at, n, d, step, kt, stride);
  }

  // acc_h = acc_h * alpha_h + sum over the L keys at key_at of p_h[j] * v_j, for one row's `group` heads
  // (head h's weights at p + h * p_stride, its acc at acc + h * d)
  // (an int8 cache's rows with their scales v_scales, kv_int8.h)
  template <class O, class C>
  static void values(int64_t group, int64_t d, const float* p, int64_t p_stride, const int64_t* key_at, int64_t L,
                     const C* v_cache, const float* alpha, float* acc, const Half* v_scales = nullptr) {
    value_pieces<kValueAccumulators>(
        kLanes, group, d, p, p_stride, v_cache, alpha, acc,
        [&](auto heads, auto vectors, const float* ph, const C* v, const float* al, float* o) {
          span_values<O, C, decltype(heads)::value, decltype(vectors)::value>(ph, p_stride, key_at, L, v, al, o, d,
                                                                              {v_scales, d, v - v_cache});
        });
  }
};

// For span keys j in [va, vb) (position s0 + j): v_at[j - va] = the offset of the key's V row and k_at[j - va]
// that of its first K value (its V row's offset by row; block-major by dimension), both -1 outside [ka, kb)
template <class T, class C>
void span_keys(const AttentionArgs<T, C>& a, const int64_t* table, int64_t g, int64_t s0, int64_t va, int64_t ka,
               int64_t kb, int64_t vb, int64_t* v_at, int64_t* k_at) {
  for (int64_t j = va; j < vb; ++j)
    if (j < ka || j >= kb) v_at[j - va] = k_at[j - va] = -1;
  if (ka >= kb) return;
  const int64_t first = s0 + ka;
  for (int64_t j = ka, b = first / a.block, off = first % a.block; j < kb; ++j) {  // no division per key
    const int64_t head_block = (table[b] * a.kv_heads + g) * a.block * a.d;  // this block's K (or V) of head g
    v_at[j - va] = head_block + off * a.d;
    k_at[j - va] = a.keys_by_dimension ? head_block + off : v_at[j - va];
    if (++off == a.block) off = 0, ++b;
  }
}

// Keys the near prefetch looks ahead (K) and the first keys of a span or an item sent toward L2 before
// they are read: decode rows' keys sit in their own requests' blocks, a few KB each, too short a run for
// the hardware's prefetchers
constexpr int64_t kKeysAhead = 64;
constexpr int64_t kScoreKeys = 64;  // keys widened, then scored, at a time

// The values of n keys (key i's first at at[i]; -1: none) toward L1 (Locality 3) or L2 (2): by row (step 1) each
// key's d values, by dimension the block's rows of those keys at every dimension (step apart)
template <int Locality = 3, class C>
void prefetch_keys(const C* cache, const int64_t* at, int64_t n, int64_t d, int64_t step) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(C));
  for (int64_t i = 0; i < n; ++i) {
    if (at[i] < 0) continue;
    if (step == 1) {
      for (int64_t c = 0; c < d; c += kLine) __builtin_prefetch(cache + at[i] + c, 0, Locality);
    } else if (i == 0 || at[i] != at[i - 1] + 1) {  // a new run of one block's keys: its rows at each dimension
      for (int64_t c = 0; c < d; c += std::max<int64_t>(1, kLine / step))
        __builtin_prefetch(cache + at[i] + c * step, 0, Locality);
    }
  }
}

// An int8 cache's K and V scales of the head block starting at `at` toward L1 (Locality 3) or L2 (2): both
// laid out block * groups values from at / d * groups (kv_int8.h)
template <class T, class C>
void prefetch_block_scales(const AttentionArgs<T, C>& a, int64_t at, int locality) {
  const int64_t first = at / a.d * kv_groups(a.d), count = a.block * kv_groups(a.d);
  for (int64_t i = 0; i < count; i += 32) {
    if (locality == 3) {
      __builtin_prefetch(a.k_scales + first + i, 0, 3);
      __builtin_prefetch(a.v_scales + first + i, 0, 3);
    } else {
      __builtin_prefetch(a.k_scales + first + i, 0, 2);
      __builtin_prefetch(a.v_scales + first + i, 0, 2);
    }
  }
}

// One block's K and V of one head (block * d values in a row, in either layout, at `at`) into L2
template <class T, class C>
void prefetch_block(const AttentionArgs<T, C>& a, int64_t at) {
  for (int64_t i = 0; i < a.block * a.d; i += 64 / static_cast<int64_t>(sizeof(C))) {
    __builtin_prefetch(a.k_cache + at + i, 0, 2);
    __builtin_prefetch(a.v_cache + at + i, 0, 2);
  }
  if constexpr (std::is_same_v<C, int8_t>) prefetch_block_scales(a, at, 2);
}


// The blocks of head g holding the span keys [s0, s0 + n) into L2, K's and V's
template <class T, class C>
void prefetch_span(const AttentionArgs<T, C>& a, const int64_t* table, int64_t g, int64_t s0, int64_t n) {
  for (int64_t b = s0 / a.block; b * a.block < s0 + n; ++b) prefetch_block(a, (table[b] * a.kv_heads + g) * a.block * a.d);
}

// The first position a row at `pos` sees: 0, or the start of its sliding window
template <class T, class C>
int64_t first_key(const AttentionArgs<T, C>& a, int64_t pos) {
  return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
}

// One item: a tile's rows, KV head g (the header's algorithm)
template <class O, class T, class C, class Passes>
void attention_item(const AttentionArgs<T, C>& a, const AttentionTile& tile, int64_t g, SpanScratch& s) {
  using V = typename O::V;
  constexpr int64_t kVec = Passes::kKeyVector;
  const int64_t group = a.heads / a.kv_heads, d = a.d, nq = tile.rows * group;
  s.start(nq, d);
  for (int64_t r = 0; r < tile.rows; ++r) {
    const T* qrow = a.q + ((tile.row + r) * a.heads + g * group) * d;
    for (int64_t i = 0; i < group * d; ++i) s.qf[r * group * d + i] = to_float(qrow[i]);
  }
  const int64_t* table = a.tables + a.owners[tile.row] * a.table_width;
  constexpr bool kInt8 = std::is_same_v<C, int8_t>;  // read as q * s (kv_int8.h)
  const bool widened = tile.rows > 1 && !std::is_same_v<C, float>;  // 16-bit or int8 V rows read by several rows
  const bool in_place = tile.rows == 1 && a.keys_by_dimension;  // a decode row: scores straight from the cache
  const int64_t tile_lo = first_key(a, a.positions[tile.row]), tile_hi = a.positions[tile.row + tile.rows - 1] + 1;
  for (int64_t s0 = tile_lo / kSpan * kSpan; s0 < tile_hi; s0 += kSpan) {
    const int64_t ka = std::max(s0, tile_lo) - s0, kb = std::min(s0 + kSpan, tile_hi) - s0;  // span-local
    const int64_t va = ka / kVec * kVec, vb = (kb + kVec - 1) / kVec * kVec;
    span_keys(a, table, g, s0, va, ka, kb, vb, s.key_at.data() + va, s.k_at.data() + va);
    // the next span's first keys on their way into L2 while this one is computed
    if (s0 + kSpan < tile_hi)
      prefetch_span(a, table, g, s0 + kSpan, std::min(s0 + kSpan + kKeysAhead, tile_hi) - s0 - kSpan);
    const int64_t step = a.keys_by_dimension ? a.block : 1;  // between a key's values at consecutive dimensions
    if (widened)  // each V row widened once for the tile's rows (exact: the same values)
      for (int64_t j = ka; j < kb; ++j) {
        if constexpr (kInt8)
          dequantize_kv_row<O>(a.v_cache + s.key_at[j], a.v_scales + row_scale_at(s.key_at[j], d, 0), d,
                               s.vw.data() + j * d);
        else
          for (int64_t c = 0; c < d; c += kLanes) O::store(s.vw.data() + j * d + c, O::load(a.v_cache + s.key_at[j] + c));
      }
    // keys kScoreKeys at a time (widened and transposed, unless read in place), then their scores, so that
    // the loads of the keys ahead overlap the arithmetic
    for (int64_t i = va; i < vb; i += kScoreKeys) {
      const int64_t n = std::min(kScoreKeys, vb - i), ahead = std::min(i + kKeysAhead, vb);
      const int64_t far = std::clamp<int64_t>(vb - i - kKeysAhead, 0, n);
      prefetch_keys(a.k_cache, s.k_at.data() + ahead, far, d, step);  // K kKeysAhead keys on into L1
      if constexpr (kInt8)  // and the scales of those keys' blocks
        for (int64_t j = ahead, last = -1; j < ahead + far; ++j) {
          const int64_t head_block = s.key_at[j] < 0 ? -1 : s.key_at[j] / (a.block * d);
          if (head_block >= 0 && head_block != last) prefetch_block_scales(a, head_block * a.block * d, 3);
          last = head_block;
        }
      // V into L2 (read after every score): a decode row's keys ahead, a tile's these (unless widened)
      if (in_place)
        prefetch_keys<2>(a.v_cache, s.key_at.data() + ahead, far, d, 1);
      else if (!widened)
        prefetch_keys<2>(a.v_cache, s.key_at.data() + i, n, d, 1);
      const int64_t chunk = (i - va) / kScoreKeys;  // the next item's first blocks, one a chunk
      if (s0 <= tile_lo && chunk < static_cast<int64_t>(s.following.size())) prefetch_block(a, s.following[chunk]);
      if (in_place) {
        Passes::template scores_in_place<O>(s.qf.data(), nq, d, a.k_cache, s.k_at.data() + i, n, step, a.scale,
                                            s.kt.data() + i, kSpanStride, s.scores.data() + i, kSpanStride, a.k_scales);
        continue;
      }
      for (int64_t j = i; j < i + n; j += kTotalVector) {
        const int64_t keys = std::min(kTotalVector, i + n - j);
        if constexpr (kInt8)
          dequantize_keys<O>(a.k_cache, a.k_scales, s.k_at.data() + j, keys, d, a.block, a.keys_by_dimension,
                             s.kt.data() + j, kSpanStride);
        else
          Passes::template transpose<O>(a.k_cache, s.k_at.data() + j, keys, d, step, s.kt.data() + j, kSpanStride);
      }
      Passes::template scores<O>(s.qf.data(), nq, d, s.kt.data() + i, kSpanStride, n, a.scale, s.scores.data() + i,
                                 kSpanStride);
    }
    for (int64_t r = 0; r < tile.rows; ++r) {
      const int64_t pos = a.positions[tile.row + r];
      const int64_t lo = std::max(s0, first_key(a, pos)) - s0, hi = std::min(s0 + kSpan, pos + 1) - s0;
      if (lo >= hi) continue;  // no key of this span: the row's state is untouched
      for (int64_t h = 0; h < group; ++h) {
        const int64_t qi = r * group + h;
        float* sc = s.scores.data() + qi * kSpanStride;
        if (a.softcap > 0.0f)
          for (int64_t j = lo; j < hi; ++j) sc[j] = a.softcap * std::tanh(sc[j] / a.softcap);
        Passes::template weights<O>(sc, lo, hi, s.m[qi], s.l[qi], s.alpha[qi]);
      }
      const float* p = s.scores.data() + r * group * kSpanStride + lo;
      if (widened) {
        Passes::template values<O, float>(group, d, p, kSpanStride, s.vw_at.data() + lo, hi - lo, s.vw.data(),
                                          s.alpha.data() + r * group, s.acc.data() + r * group * d);
      } else {
        Passes::template values<O, C>(group, d, p, kSpanStride, s.key_at.data() + lo, hi - lo, a.v_cache,
                                      s.alpha.data() + r * group, s.acc.data() + r * group * d, a.v_scales);
      }
    }
  }
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t h = 0; h < group; ++h) {
      const int64_t qi = r * group + h;
      float* out = a.out + ((tile.row + r) * a.heads + g * group + h) * d;
      const V total = O::set1(s.l[qi]);
      for (int64_t c = 0; c < d; c += kLanes) O::store(out + c, O::div(O::load(s.acc.data() + qi * d + c), total));
    }
}

// The items (tile, KV head) that a shared counter hands out, until none are left: one call per thread
// Items are claimed `claim` at a time (a decode step's rows: a row's KV heads, whose blocks sit side by side,
// go to one thread in order). Before it computes an item, a thread sends the next item's first blocks of K
// and V toward L2, one block a key vector of the item's first span: a decode row's keys sit in its own
// request's blocks, which no earlier item read.
template <class O, class T, class C = T, class Passes = EightLanePasses>
void attention_items(const AttentionArgs<T, C>& a, const AttentionTile* tiles, int64_t items, int64_t claim,
                     std::atomic<int64_t>* next) {
  // kept from call to call: buffers of this size come from fresh mappings, whose page faults and unmapping
  // (a TLB shootdown to every core of the process) cost more than a decode step's attention
  thread_local SpanScratch scratch;
  for (int64_t begin = next->fetch_add(claim); begin < items; begin = next->fetch_add(claim)) {
    const int64_t end = std::min(items, begin + claim);
    for (int64_t item = begin; item < end; ++item) {
      scratch.following.clear();
      if (item + 1 < end) {
        const AttentionTile& tile = tiles[(item + 1) / a.kv_heads];
        const int64_t lo = first_key(a, a.positions[tile.row]), hi = a.positions[tile.row + tile.rows - 1] + 1;
        const int64_t* table = a.tables + a.owners[tile.row] * a.table_width;
        for (int64_t b = lo / a.block; b * a.block < std::min(lo + kKeysAhead, hi); ++b)
          scratch.following.push_back((table[b] * a.kv_heads + (item + 1) % a.kv_heads) * a.block * a.d);
      }
      attention_item<O, T, C, Passes>(a, tiles[item / a.kv_heads], item % a.kv_heads, scratch);
    }
  }
}

}  // namespace nxk
