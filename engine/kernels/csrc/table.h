// One table of kernel entry points per instruction set; bindings.cpp picks a table at run time.
// Entry points take raw pointers and a range of work items, so threads split work between calls.
#pragma once

#include <cstdint>

#include "kernels.h"
#include "qdot.h"
#include "quantized.h"
#include "rope.h"

namespace nxk {

struct KernelTable {
  const char* name;
  void (*linear_f32)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t);
  void (*linear_bf16)(const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t);
  void (*attention_f32)(const AttentionArgs<float>&, int64_t, int64_t);
  void (*attention_bf16)(const AttentionArgs<uint16_t>&, int64_t, int64_t);
  void (*attention_f32_f16)(const AttentionArgs<float, Half>&, int64_t, int64_t);  // float16 cache
  void (*rms_norm_f32)(const float*, int64_t, float, float*, int64_t, int64_t);
  void (*rms_norm_bf16)(const uint16_t*, int64_t, float, float*, int64_t, int64_t);
  void (*softmax)(const float*, int64_t, bool, float*, int64_t, int64_t);
  void (*row_stats)(const float*, int64_t, int64_t*, float*, float*, int64_t, int64_t);
  void (*silu_mul_f32)(const float*, int64_t, bool, float*, int64_t, int64_t);
  void (*silu_mul_bf16)(const uint16_t*, int64_t, bool, float*, int64_t, int64_t);
  void (*qlinear_q8)(const float*, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  void (*qlinear_q4)(const float*, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  void (*qlinear_q4s)(const float*, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  void (*qlinear_q8s)(const float*, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  // int8 and int16 activations over the dot layouts (qdot.h), one entry per base format
  using QDot = void (*)(const QActs&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  using QDot16 = void (*)(const QActs16&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
  QDot qdot_q8, qdot_q4, qdot_q4s, qdot_q8s;
  QDot16 qdot16_q8, qdot16_q4, qdot16_q4s, qdot16_q8s;
  // a step's rows quantized for those (qdot.h quantize_rows: the same results in every table)
  void (*quantize_i8)(const float*, int64_t, int8_t*, float*, int32_t*, int64_t, int64_t);
  void (*quantize_i16)(const float*, int64_t, int16_t*, float*, int32_t*, int64_t, int64_t);
  // RoPE on a step's rows and their keys and values into a float32 or float16 cache (rope.h)
  void (*rope_rows_f32)(const RopeRows<float>&, int64_t, int64_t);
  void (*rope_rows_f16)(const RopeRows<Half>&, int64_t, int64_t);
};

// The table instantiated over vector struct O.
template <class O>
KernelTable make_table(const char* name) {
  return KernelTable{
      name,
      &linear_panels<O, float>,
      &linear_panels<O, uint16_t>,
      &attention_items<O, float>,
      &attention_items<O, uint16_t>,
      &attention_items<O, float, Half>,
      &rms_norm_rows<O, float>,
      &rms_norm_rows<O, uint16_t>,
      &softmax_rows<O>,
      &row_stats_rows<O>,
      &silu_mul_rows<O, float>,
      &silu_mul_rows<O, uint16_t>,
      &qlinear_panels<O, kQ8>,
      &qlinear_panels<O, kQ4>,
      &qlinear_panels<O, kQ4S>,
      &qlinear_panels<O, kQ8S>,
      &qdot_panels<O, kQ8, int8_t>,
      &qdot_panels<O, kQ4, int8_t>,
      &qdot_panels<O, kQ4S, int8_t>,
      &qdot_panels<O, kQ8S, int8_t>,
      &qdot_panels<O, kQ8, int16_t>,
      &qdot_panels<O, kQ4, int16_t>,
      &qdot_panels<O, kQ4S, int16_t>,
      &qdot_panels<O, kQ8S, int16_t>,
      &quantize_rows<int8_t>,
      &quantize_rows<int16_t>,
      &rope_rows<O, float>,
      &rope_rows<O, Half>,
  };
}

// The eight integer-activation entries (the four base formats, int8 and int16 inputs) from one family of
// dot kernels: D::run<F, A> is a qdot_panels-shaped function for base format F and input type A.
template <class D>
void set_dot_entries(KernelTable& t) {
  t.qdot_q8 = D::template run<kQ8, int8_t>;
  t.qdot_q4 = D::template run<kQ4, int8_t>;
  t.qdot_q4s = D::template run<kQ4S, int8_t>;
  t.qdot_q8s = D::template run<kQ8S, int8_t>;
  t.qdot16_q8 = D::template run<kQ8, int16_t>;
  t.qdot16_q4 = D::template run<kQ4, int16_t>;
  t.qdot16_q4s = D::template run<kQ4S, int16_t>;
  t.qdot16_q8s = D::template run<kQ8S, int16_t>;
}

KernelTable generic_table();
KernelTable avx2_table();
KernelTable avx512_table();  // avx2_table with 16-lane linears (isa_avx512.cpp)
void use_avx2_quantizers(KernelTable& t);  // quantize_rows in 8 lanes (isa_avx2_quantize.cpp)
void use_avx512_quantizers(KernelTable& t);  // quantize_rows in 16 lanes (isa_avx512_quantize.cpp)
void use_avx512_attention(KernelTable& t);  // attention with 16-lane passes (isa_avx512_attention.cpp)
void use_vnni_dots(KernelTable& t);  // the int8/int16-activation entries for AVX512-VNNI CPUs (isa_avx512_vnni.cpp)

}  // namespace nxk
