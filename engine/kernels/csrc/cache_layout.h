// The two layouts a K cache may have, told apart by its strides. Both are [blocks, kv_heads, block, d] tensors:
//   by row        contiguous: each key's d values side by side (V caches, and K caches callers build)
//   by dimension  a transposed view of [blocks, kv_heads, d, block] storage: each block's keys side by side
//                 per dimension, so a vector of keys at one dimension is one load (engine/kv/cache.py's K)
// The kernels read and write either and give the same bits (the layout moves values, never rounds them).
#pragma once

#include <utility>

#include <torch/extension.h>

#include "kv_int8.h"

namespace nxk {

// true for the by-dimension layout, false for the contiguous one; any other strides are refused
inline bool keys_by_dimension(const torch::Tensor& k_cache) {
  TORCH_CHECK(k_cache.device().is_cpu() && k_cache.dim() == 4, "the K cache must be a [blocks, kv_heads, block, d] CPU tensor");
  if (k_cache.is_contiguous()) return false;
  const int64_t block = k_cache.size(2), d = k_cache.size(3);
  TORCH_CHECK(k_cache.stride(3) == block && k_cache.stride(2) == 1 && k_cache.stride(1) == d * block &&
                  k_cache.stride(0) == k_cache.size(1) * d * block,
              "the K cache must be contiguous or a transpose(2, 3) view of contiguous [blocks, kv_heads, d, block] storage");
  return true;
}

// the cache check for K: on the CPU, in one of the two layouts
inline void check_key_cache(const torch::Tensor& k_cache) { (void)keys_by_dimension(k_cache); }

// An int8 cache's scales (kv_int8.h): a float16 [blocks, kv_heads, block, groups] tensor laid out as the cache
// it scales (K by dimension: a transpose(2, 3) view of [blocks, kv_heads, groups, block] storage); where a size
// is 1 its stride places nothing and is not checked
inline void check_cache_scales(const torch::Tensor& scales, const torch::Tensor& cache, bool by_dimension,
                               const char* what) {
  TORCH_CHECK(scales.device().is_cpu() && scales.scalar_type() == torch::kHalf && scales.dim() == 4, what,
              " must be a float16 CPU tensor");
  const int64_t heads = cache.size(1), block = cache.size(2), groups = kv_groups(cache.size(3));
  TORCH_CHECK(scales.size(0) == cache.size(0) && scales.size(1) == heads && scales.size(2) == block &&
                  scales.size(3) == groups,
              what, " must be [blocks, kv_heads, block, ceil(head_dim / ", kKvGroup, ")]");
  const int64_t by_row[4] = {heads * block * groups, block * groups, groups, 1};
  const int64_t by_column[4] = {heads * groups * block, groups * block, 1, block};
  for (int i = 0; i < 4; ++i)
    TORCH_CHECK(scales.size(i) == 1 || scales.stride(i) == (by_dimension ? by_column : by_row)[i], what,
                " must be laid out as the cache it scales (", by_dimension ? "by dimension" : "by row", ")");
}

// The scales of K and V caches as the kernels take them: for int8 caches (kv_int8.h) both given and checked
// (V by row, K as K is held), for float caches both absent (nullptr, nullptr)
inline std::pair<Half*, Half*> cache_scales(const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                            const c10::optional<torch::Tensor>& k_scales,
                                            const c10::optional<torch::Tensor>& v_scales) {
  const bool present = k_scales.has_value() && k_scales->defined() && k_scales->numel() > 0;
  const bool v_present = v_scales.has_value() && v_scales->defined() && v_scales->numel() > 0;
  if (k_cache.scalar_type() != torch::kChar) {
    TORCH_CHECK(!present && !v_present, "scales go with an int8 KV cache only");
    return {nullptr, nullptr};
  }
  TORCH_CHECK(present && v_present && v_cache.scalar_type() == torch::kChar,
              "an int8 KV cache needs its K and V scales (kv_int8.h)");
  check_cache_scales(*k_scales, k_cache, keys_by_dimension(k_cache), "the K scales");
  check_cache_scales(*v_scales, v_cache, false, "the V scales");
  TORCH_CHECK(v_cache.is_contiguous(), "the V cache must be contiguous");
  return {reinterpret_cast<Half*>(k_scales->data_ptr<at::Half>()), reinterpret_cast<Half*>(v_scales->data_ptr<at::Half>())};
}

}  // namespace nxk
