// The two layouts a K cache may have, told apart by its strides. Both are [blocks, kv_heads, block, d] tensors:
//   by row        contiguous: each key's d values side by side (V caches, and K caches callers build)
//   by dimension  a transposed view of [blocks, kv_heads, d, block] storage: each block's keys side by side
//                 per dimension, so a vector of keys at one dimension is one load (engine/kv/cache.py's K)
// The kernels read and write either and give the same bits (the layout moves values, never rounds them).
#pragma once

#include <torch/extension.h>

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

}  // namespace nxk
