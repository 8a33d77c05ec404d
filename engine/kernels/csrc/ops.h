// Launchers shared by the torch-facing entry points (bindings.cpp) and the decoder stack (decoder.cpp):
// each runs one kernel of a table over raw buffers, splitting its work between threads over outputs
// only (column panels, rows, query rows x KV heads), never inside a reduction. One place decides each
// split, so a kernel called from Python and the same kernel inside the decoder's layer loop run alike.
// T is float (float32) or uint16_t (bfloat16 bits); a linear's weight may also be Half (float16 bits).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "table.h"

namespace nxk {

// The table for backend ``isa``: "avx512_vnni", "avx512", "avx2" or "generic". Raises on any other name,
// and on a table whose instructions this CPU lacks (cpu.h): a wrong name never runs an illegal instruction.
// Each table is built on its first use, after that check: a table's builder is compiled with its
// instruction set (the pragma of its file), so building one this CPU lacks is itself illegal (an AVX2
// CPU asking for "avx2" must never build the AVX-512 tables).
inline const KernelTable& table_for(const std::string& isa) {
  if (isa == "generic") {
    static const KernelTable generic = generic_table();
    return generic;
  }
  if (isa == "avx2") {
    TORCH_CHECK(cpu_has_avx2(), "the avx2 kernels need AVX2, FMA and F16C, which this CPU lacks");
    static const KernelTable avx2 = avx2_table();
    return avx2;
  }
  if (isa == "avx512") {
    TORCH_CHECK(cpu_has_avx512(), "the avx512 kernels need AVX512F, AVX2, FMA and F16C, which this CPU lacks");
    static const KernelTable avx512 = avx512_table();
    return avx512;
  }
  TORCH_CHECK(isa == "avx512_vnni", "unknown instruction set ", isa);
  TORCH_CHECK(cpu_has_avx512_vnni(), "the avx512_vnni kernels need AVX512F, BW, VL and VNNI with AVX2, FMA and ",
              "F16C, which this CPU lacks");
  static const KernelTable avx512_vnni = avx512_vnni_table();
  return avx512_vnni;
}

// y [M, N] float32 = x [M, K] float32 @ W^T over a packed weight [P, K, 16] of T
template <class T>
void run_linear(const KernelTable& t, const float* x, int64_t m, int64_t k, const T* packed, int64_t n, float* y) {
  if (m == 0) return;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  // at least 16 panels a thread at one row (a 576-wide layer still splits in two), fewer at many rows
  const int64_t grain = std::max<int64_t>(1, 16 / std::max<int64_t>(1, m));
  at::parallel_for(0, panels, grain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      t.linear_f32(x, m, k, packed, n, y, b, e);
    } else if constexpr (std::is_same_v<T, Half>) {
      t.linear_f16(x, m, k, packed, n, y, b, e);
    } else {
      t.linear_bf16(x, m, k, packed, n, y, b, e);
    }
  });
}

// y [M, N] float32 = x [M, K] float32 @ W^T over a weight in a dot layout (qdot.h): x quantized per row
// to Q (int8 or int16) first, into buffers this thread keeps between calls
template <class Q>
void run_qdot(const KernelTable& t, const float* x, int64_t m, int64_t k, const uint8_t* packed, int64_t format,
              int64_t n, float* y) {
  thread_local std::vector<Q> q;
  thread_local std::vector<float> d;
  thread_local std::vector<int32_t> s;
  q.resize(m * k);
  d.resize(m * k / kQBlock);
  s.resize(m * k / kQBlock * 2);
  // pointers, not the thread_local names: inside the lambdas those would be each worker's own buffers
  Q* qp = q.data();
  float* dp = d.data();
  int32_t* sp = s.data();
  const auto quantize = [&t]() {
    if constexpr (sizeof(Q) == 1) {
      return t.quantize_i8;
    } else {
      return t.quantize_i16;
    }
  }();
  at::parallel_for(0, m, 8, [&](int64_t b, int64_t e) { quantize(x, k, qp, dp, sp, b, e); });
  const QActsOf<Q> acts{qp, dp, sp};
  const int base = base_format(format);
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t grain = std::max<int64_t>(2, 16 / std::max<int64_t>(1, m));
  const auto dot = [&t, base]() {
    if constexpr (sizeof(Q) == 1) {
      return t.qdot[base];
    } else {
      return t.qdot16[base];
    }
  }();
  at::parallel_for(0, panels, grain, [&](int64_t b, int64_t e) { dot(acts, m, k, packed, n, y, b, e); });
}

// y [M, N] float32 = x [M, K] float32 @ W^T over a packed quantized weight in ``format`` (quantized.h,
// or a dot layout: run_qdot)
inline void run_qlinear(const KernelTable& t, const float* x, int64_t m, int64_t k, const uint8_t* packed,
                        int64_t format, int64_t n, float* y) {
  if (m == 0) return;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  if (is_wide_format(format)) {
    run_qdot<int16_t>(t, x, m, k, packed, format, n, y);
    return;
  }
  if (is_dot_format(format)) {
    run_qdot<int8_t>(t, x, m, k, packed, format, n, y);
    return;
  }
  const auto fn = t.qlinear[format];
  const int64_t grain = std::max<int64_t>(2, 16 / std::max<int64_t>(1, m));  // even: panel pairs stay whole
  at::parallel_for(0, panels, grain, [&](int64_t b, int64_t e) { fn(x, m, k, packed, n, y, b, e); });
}

// out [rows, D] float32 = x / rms(x), row by row
template <class T>
void run_rms_norm(const KernelTable& t, const T* x, int64_t rows, int64_t d, float eps, float* out) {
  at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      t.rms_norm_f32(x, d, eps, out, b, e);
    } else {
      t.rms_norm_bf16(x, d, eps, out, b, e);
    }
  });
}

// out [rows, I] float32 = silu(gate) * up (or GELU-tanh(gate) * up), for rows of [gate | up] [rows, 2I]
template <class T>
void run_silu_mul(const KernelTable& t, const T* gate_up, int64_t rows, int64_t inter, float* out, bool gelu = false) {
  at::parallel_for(0, rows, 8, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      t.silu_mul_f32(gate_up, inter, gelu, out, b, e);
    } else {
      t.silu_mul_bf16(gate_up, inter, gelu, out, b, e);
    }
  });
}

// RoPE and the cache writes of a step's rows (rope.h) through the table's entry for the cache's type,
// rows shared between threads (each row writes its own slot, so the split changes no bit)
template <class C>
void run_rope(const KernelTable& t, const RopeRows<C>& a, int64_t rows, int64_t grain) {
  at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<C, Half>) {
      t.rope_rows_f16(a, b, e);
    } else if constexpr (std::is_same_v<C, int8_t>) {
      t.rope_rows_i8(a, b, e);
    } else {
      t.rope_rows_f32(a, b, e);
    }
  });
}

// attention for every (tile, KV head) item of ``a`` (attention.h). Items cost what their rows' keys cost
// (a prefill chunk's first tile sees few keys, a long conversation's decode row many), so each thread
// takes the next few items from a shared counter until none are left. Every row's bits are its own whichever
// tile holds it and whichever thread runs it, so the split never changes a bit.
template <class T, class C>
void run_attention(const KernelTable& t, const AttentionArgs<T, C>& a, int64_t rows) {
  const std::vector<AttentionTile> tiles = attention_tiles(a, rows);
  const int64_t items = static_cast<int64_t>(tiles.size()) * a.kv_heads;
  if (items == 0) return;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  // whole tiles, about 16 claims a thread (a short tail): a decode step's row takes its KV heads in order
  const int64_t claim = a.kv_heads * std::max<int64_t>(1, static_cast<int64_t>(tiles.size()) / (threads * 16));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    if constexpr (std::is_same_v<C, Half>) {
      static_assert(std::is_same_v<T, float>, "a float16 cache is read under float32 queries");
      t.attention_f32_f16(a, tiles.data(), items, claim, &next);
    } else if constexpr (std::is_same_v<C, int8_t>) {
      static_assert(std::is_same_v<T, float>, "an int8 cache is read under float32 queries");
      t.attention_f32_i8(a, tiles.data(), items, claim, &next);
    } else if constexpr (std::is_same_v<T, float>) {
      t.attention_f32(a, tiles.data(), items, claim, &next);
    } else {
      t.attention_bf16(a, tiles.data(), items, claim, &next);
    }
  });
}

}  // namespace nxk
