// One table of kernel entry points per backend, each for one fixed set of CPU features (cpu.h): what a
// table holds never depends on the CPU it runs on. bindings.cpp picks a table by name at run time.
// Entry points take raw pointers and a range of work items, so threads split work between calls.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "attention.h"
#include "kernels.h"
#include "qdot.h"
#include "quantized.h"
#include "rope.h"

namespace nxk {

struct KernelTable {
  const char* name;
  void (*linear_f32)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t);
  void (*linear_bf16)(const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t);
  void (*linear_f16)(const float*, int64_t, int64_t, const Half*, int64_t, float*, int64_t, int64_t);
  // attention (attention.h): the items (tile, KV head) a shared counter hands out, so many a claim; one call a thread
  template <class T, class C = T>
  using Attention = void (*)(const AttentionArgs<T, C>&, const AttentionTile*, int64_t, int64_t, std::atomic<int64_t>*);
  Attention<float> attention_f32;
  Attention<uint16_t> attention_bf16;
  Attention<float, Half> attention_f32_f16;  // float16 cache
  Attention<float, int8_t> attention_f32_i8;  // int8 cache (kv_int8.h)
  void (*rms_norm_f32)(const float*, int64_t, float, float*, int64_t, int64_t);
  void (*rms_norm_bf16)(const uint16_t*, int64_t, float, float*, int64_t, int64_t);
  void (*softmax)(const float*, int64_t, bool, float*, int64_t, int64_t);
  void (*row_stats)(const float*, int64_t, int64_t*, float*, float*, int64_t, int64_t);
  void (*silu_mul_f32)(const float*, int64_t, bool, float*, int64_t, int64_t);
  void (*silu_mul_bf16)(const uint16_t*, int64_t, bool, float*, int64_t, int64_t);
  // The quantized linears, one entry per base format (quantized.h) and route: float activations over the
  // quantized.h layout; int8 and int16 activations over its dot layout (qdot.h)
  using QLinear = void (*)(const float*, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  using QDot = void (*)(const QActs&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  using QDot16 = void (*)(const QActs16&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  QLinear qlinear[kBaseFormats];
  QDot qdot[kBaseFormats];
  QDot16 qdot16[kBaseFormats];
  // a step's rows quantized for those (qdot.h quantize_rows: the same results in every table)
  void (*quantize_i8)(const float*, int64_t, int8_t*, float*, int32_t*, int64_t, int64_t);
  void (*quantize_i16)(const float*, int64_t, int16_t*, float*, int32_t*, int64_t, int64_t);
  // RoPE on a step's rows and their keys and values into a float32, float16 or int8 cache (rope.h)
  void (*rope_rows_f32)(const RopeRows<float>&, int64_t, int64_t);
  void (*rope_rows_f16)(const RopeRows<Half>&, int64_t, int64_t);
  void (*rope_rows_i8)(const RopeRows<int8_t>&, int64_t, int64_t);
};

// fn(std::integral_constant<int, F>{}) for every base format F (quantized.h), in order: the loop that
// fills a table's per-format entries
template <class Fn, int... F>
void for_each_base_format(Fn&& fn, std::integer_sequence<int, F...>) {
  (fn(std::integral_constant<int, F>{}), ...);
}
template <class Fn>
void for_each_base_format(Fn&& fn) {
  for_each_base_format(fn, std::make_integer_sequence<int, kBaseFormats>{});
}

// The integer-activation entries (every base format, int8 and int16 inputs) from one family of dot
// kernels: D::run<F, A> is a qdot_panels-shaped function for base format F and input type A.
template <class D>
void set_dot_entries(KernelTable& t) {
  for_each_base_format([&t](auto format) {
    constexpr int F = decltype(format)::value;
    t.qdot[F] = D::template run<F, int8_t>;
    t.qdot16[F] = D::template run<F, int16_t>;
  });
}

// The portable dot kernels (qdot.h's qdot_panels), instantiated over vector struct O.
template <class O>
struct PortableDots {
  template <int F, class A>
  static constexpr auto run = &qdot_panels<O, F, A>;
};

// The table instantiated over vector struct O.
template <class O>
KernelTable make_table(const char* name) {
  KernelTable t{};
  t.name = name;
  t.linear_f32 = &linear_panels<O, float>;
  t.linear_bf16 = &linear_panels<O, uint16_t>;
  t.linear_f16 = &linear_panels<O, Half>;
  t.attention_f32 = &attention_items<O, float>;
  t.attention_bf16 = &attention_items<O, uint16_t>;
  t.attention_f32_f16 = &attention_items<O, float, Half>;
  t.attention_f32_i8 = &attention_items<O, float, int8_t>;
  t.rms_norm_f32 = &rms_norm_rows<O, float>;
  t.rms_norm_bf16 = &rms_norm_rows<O, uint16_t>;
  t.softmax = &softmax_rows<O>;
  t.row_stats = &row_stats_rows<O>;
  t.silu_mul_f32 = &silu_mul_rows<O, float>;
  t.silu_mul_bf16 = &silu_mul_rows<O, uint16_t>;
  for_each_base_format([&t](auto format) {
    constexpr int F = decltype(format)::value;
    t.qlinear[F] = &qlinear_panels<O, F>;
  });
  set_dot_entries<PortableDots<O>>(t);
  t.quantize_i8 = &quantize_rows<int8_t>;
  t.quantize_i16 = &quantize_rows<int16_t>;
  t.rope_rows_f32 = &rope_rows<O, float>;
  t.rope_rows_f16 = &rope_rows<O, Half>;
  t.rope_rows_i8 = &rope_rows<O, int8_t>;
  return t;
}

// The tables, fastest last, each for the CPU features cpu.h checks before table_for (ops.h) hands it out
KernelTable generic_table();  // scalar lanes: any CPU (isa_generic.cpp)
KernelTable avx2_table();  // AVX2, FMA, F16C (isa_avx2.cpp)
KernelTable avx512_table();  // + AVX512F: 16-lane linears, attention and quantizers (isa_avx512.cpp)
KernelTable avx512_vnni_table();  // + AVX512BW, VL, VNNI: integer-activation linears in VNNI (isa_avx512_vnni.cpp)
void use_avx2_quantizers(KernelTable& t);  // quantize_rows in 8 lanes (isa_avx2_quantize.cpp)
void use_avx512_quantizers(KernelTable& t);  // quantize_rows in 16 lanes (isa_avx512_quantize.cpp)
void use_avx512_attention(KernelTable& t);  // attention with 16-lane passes (isa_avx512_attention.cpp)

}  // namespace nxk
