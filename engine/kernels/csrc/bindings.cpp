// Torch-facing entry points: argument checks, output allocation, the split of work between threads
// (over outputs only), and the table of the backend each call names (ops.h table_for).
#include <torch/extension.h>

#include <optional>
#include <utility>
#include <vector>

#include "cache_layout.h"
#include "decoder.h"
#include "huge_pages.h"
#include "ops.h"
#include "quantized_rows.h"
#include "repack.h"

namespace {

using nxk::table_for;

void check_cpu(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
}

// a packed quantized weight's shape: [P, K / (32 x group), group bytes] uint8 (quantized.h)
void check_packed(const torch::Tensor& packed, int64_t format) {
  const int64_t group = nxk::group_blocks(format), bytes = nxk::group_bytes(format);
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == bytes,
              "packed weight must be [P, K / ", nxk::kQBlock * group, ", ", bytes, "] uint8");
}

// x [M, K] float32; packed [P, K, 16] float32, bfloat16 or float16 -> y [M, N] float32
torch::Tensor linear(const std::string& isa, const torch::Tensor& x, const torch::Tensor& packed, int64_t n) {
  check_cpu(x, "x");
  check_cpu(packed, "packed weight");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [M, K] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == nxk::kPanel, "packed weight must be [P, K, 16]");
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0);
  TORCH_CHECK(packed.size(1) == k, "x has K=", k, " but the weight ", packed.size(1));
  TORCH_CHECK(panels == (n + nxk::kPanel - 1) / nxk::kPanel, "packed weight does not hold N=", n);
  auto y = torch::empty({m, n}, x.options());
  const auto& t = table_for(isa);
  if (packed.scalar_type() == torch::kFloat32) {
    nxk::run_linear(t, x.data_ptr<float>(), m, k, packed.data_ptr<float>(), n, y.data_ptr<float>());
  } else if (packed.scalar_type() == torch::kHalf) {
    const auto* w = reinterpret_cast<const nxk::Half*>(packed.data_ptr<at::Half>());
    nxk::run_linear(t, x.data_ptr<float>(), m, k, w, n, y.data_ptr<float>());
  } else {
    TORCH_CHECK(packed.scalar_type() == torch::kBFloat16, "packed weight must be float32, bfloat16 or float16");
    const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
    nxk::run_linear(t, x.data_ptr<float>(), m, k, w, n, y.data_ptr<float>());
  }
  return y;
}

// x [M, K] float32; packed [P, K / 32, tile bytes] uint8 in ``format`` (quantized.h, or its dot layout:
// qdot.h, x quantized to int8 or int16 per row) -> y [M, N] float32
torch::Tensor qlinear(const std::string& isa, const torch::Tensor& x, const torch::Tensor& packed, int64_t format,
                      int64_t n) {
  check_cpu(x, "x");
  check_cpu(packed, "packed weight");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [M, K] float32");
  TORCH_CHECK(format >= 0 && format < nxk::kFormats, "unknown quantized format ", format);
  check_packed(packed, format);
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0);
  const int64_t weight_k = packed.size(1) * nxk::kQBlock * nxk::group_blocks(format);
  TORCH_CHECK(weight_k == k, "x has K=", k, " but the weight ", weight_k);
  TORCH_CHECK(panels == (n + nxk::kPanel - 1) / nxk::kPanel, "packed weight does not hold N=", n);
  auto y = torch::empty({m, n}, x.options());
  nxk::run_qlinear(table_for(isa), x.data_ptr<float>(), m, k, packed.data_ptr<uint8_t>(), format, n,
                   y.data_ptr<float>());
  return y;
}

// packed [P, K / 32, tile bytes] uint8 in ``format``; ids [T] long, each < P * 16 -> rows [T, K] float32
// (the instruction set does not matter: the values are exact in any)
torch::Tensor quantized_rows(const std::string&, const torch::Tensor& packed, int64_t format, const torch::Tensor& ids) {
  check_cpu(packed, "packed weight");
  check_cpu(ids, "ids");
  TORCH_CHECK(format >= 0 && format < nxk::kFormats, "unknown quantized format ", format);
  check_packed(packed, format);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == torch::kLong, "ids must be [T] long");
  const int64_t k = packed.size(1) * nxk::kQBlock * nxk::group_blocks(format);
  const int64_t rows = ids.size(0), limit = packed.size(0) * nxk::kPanel;
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t) TORCH_CHECK(id[t] >= 0 && id[t] < limit, "row ", id[t], " outside the weight's ", limit);
  auto out = torch::empty({rows, k}, torch::kFloat32);
  const uint8_t* data = packed.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t b, int64_t e) { nxk::quantized_rows(data, format, k, id, o, b, e); });
  return out;
}

// Each row's start in parts (tensors [rows_i, ...] whose rows are row_bytes contiguous bytes, stacked one after
// another), in ``order`` (int64 [N], indices into the stacked rows) or as stacked (N = their rows)
std::vector<const uint8_t*> stacked_rows(const std::vector<torch::Tensor>& parts, int64_t row_bytes,
                                         const std::optional<torch::Tensor>& order, int64_t n) {
  std::vector<const uint8_t*> all;
  for (const auto& part : parts) {
    TORCH_CHECK(part.device().is_cpu() && part.dim() >= 2 && part.size(0) >= 0, "parts must be CPU tensors of rows");
    TORCH_CHECK(part.numel() == 0 || part[0].is_contiguous(), "each row of a part must be contiguous");
    TORCH_CHECK(part.numel() == 0 || part[0].numel() * part.element_size() == row_bytes,
                "every part's rows must be ", row_bytes, " bytes");
    const auto* base = static_cast<const uint8_t*>(part.const_data_ptr());
    for (int64_t r = 0; r < part.size(0); ++r) all.push_back(base + r * part.stride(0) * part.element_size());
  }
  if (!order.has_value()) {
    TORCH_CHECK(static_cast<int64_t>(all.size()) == n, "the parts hold ", all.size(), " rows, not N=", n);
    return all;
  }
  const torch::Tensor index = order->contiguous();
  TORCH_CHECK(index.device().is_cpu() && index.dim() == 1 && index.scalar_type() == torch::kLong && index.size(0) == n,
              "order must be [N] int64 on the CPU");
  std::vector<const uint8_t*> rows(n);
  const int64_t* at = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(at[r] >= 0 && at[r] < static_cast<int64_t>(all.size()), "order row ", at[r], " outside the parts' ",
                all.size());
    rows[r] = all[at[r]];
  }
  return rows;
}

// parts: blocks [rows_i, K / E, B] uint8, GGUF blocks of the type ``format``'s base format holds (repack.h),
// read only, their rows stacked (a fused q|k|v or gate|up without a copy); order [N] int64 (packed row r takes
// stacked row order[r]) or None -> packed [P, K / E, group bytes] uint8 in ``format``: quant_pack.py's layout,
// byte for byte
torch::Tensor repack_quantized(const std::vector<torch::Tensor>& parts, int64_t n, int64_t k, int64_t format,
                               const std::optional<torch::Tensor>& order) {
  TORCH_CHECK(format >= 0 && format < nxk::kFormats, "unknown quantized format ", format);
  const int64_t elements = nxk::kQBlock * nxk::group_blocks(format), bytes = nxk::gguf_block_bytes(format);
  TORCH_CHECK(n >= 0 && k % elements == 0, "N must not be negative and K a multiple of ", elements);
  std::vector<torch::Tensor> held;  // each part with its rows' blocks contiguous (a map of a file already is)
  for (const auto& part : parts) {
    TORCH_CHECK(part.scalar_type() == torch::kUInt8 && part.dim() == 3 && part.size(1) == k / elements &&
                    part.size(2) == bytes,
                "blocks must be [rows, K / ", elements, ", ", bytes, "] uint8 for format ", format);
    held.push_back(part.stride(2) == 1 && part.stride(1) == bytes ? part : part.contiguous());
  }
  const std::vector<const uint8_t*> rows = stacked_rows(held, k / elements * bytes, order, n);
  const int64_t panels = (n + nxk::kPanel - 1) / nxk::kPanel;
  auto out = nxk::huge_page_empty({panels, k / elements, nxk::group_bytes(format)}, torch::kUInt8);
  const nxk::RepackArgs a{rows.data(), n, k, format, out.data_ptr<uint8_t>()};
  at::parallel_for(0, panels, 4, [&](int64_t b, int64_t e) { nxk::repack_panels(a, b, e); });
  return out;
}

// parts [rows_i, K] of one dtype (2 or 4 bytes a value: float16, bfloat16, float32), their rows stacked ->
// [P, K, 16]: 16 rows side by side per k, zeros past N, the values' bits as they are (kernels.h's layout)
torch::Tensor pack_panels(const std::vector<torch::Tensor>& parts) {
  TORCH_CHECK(!parts.empty(), "pack_panels needs at least one part");
  const auto dtype = parts[0].scalar_type();
  const int64_t k = parts[0].size(1), width = parts[0].element_size();
  TORCH_CHECK(width == 2 || width == 4, "pack_panels packs 2- or 4-byte values");
  std::vector<torch::Tensor> held;
  for (const auto& part : parts) {
    TORCH_CHECK(part.scalar_type() == dtype && part.dim() == 2 && part.size(1) == k, "parts must be [rows, K] of one dtype");
    held.push_back(part.stride(1) == 1 ? part : part.contiguous());
  }
  int64_t n = 0;
  for (const auto& part : held) n += part.size(0);
  const std::vector<const uint8_t*> rows = stacked_rows(held, k * width, std::nullopt, n);
  const int64_t panels = (n + nxk::kPanel - 1) / nxk::kPanel;
  auto out = nxk::huge_page_empty({panels, k, nxk::kPanel}, parts[0].scalar_type());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  at::parallel_for(0, panels, 1, [&](int64_t b, int64_t e) {
    if (width == 2) nxk::pack_float_panels<2>(rows.data(), n, k, o, b, e);
    else nxk::pack_float_panels<4>(rows.data(), n, k, o, b, e);
  });
  return out;
}

// x [T, D] float32 or bfloat16 -> x / rms(x) [T, D] float32
torch::Tensor rms_norm(const std::string& isa, const torch::Tensor& x, double eps) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [T, D]");
  const int64_t rows = x.size(0), d = x.size(1);
  auto out = torch::empty({rows, d}, x.options().dtype(torch::kFloat32));
  const auto& t = table_for(isa);
  float* o = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == torch::kFloat32) {
    nxk::run_rms_norm(t, x.data_ptr<float>(), rows, d, e, o);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
    nxk::run_rms_norm(t, reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), rows, d, e, o);
  }
  return out;
}

// logits [S, V] float32 -> softmax or log-softmax over V, [S, V] float32
torch::Tensor softmax(const std::string& isa, const torch::Tensor& x, bool log_space) {
  check_cpu(x, "logits");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "logits must be [S, V] float32");
  auto out = torch::empty_like(x);
  const auto& t = table_for(isa);
  const float* xp = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t v = x.size(1);
  at::parallel_for(0, x.size(0), 1, [&](int64_t b, int64_t e) { t.softmax(xp, v, log_space, o, b, e); });
  return out;
}

// logits [S, V] float32 -> (argmax [S] int64, max [S] float32, log_sum [S] float32): each row's first
// maximum, and its log-softmax as (x - max) - log_sum (the bits softmax(log_space) gives)
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> row_stats(const std::string& isa, const torch::Tensor& x) {
  check_cpu(x, "logits");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.size(1) > 0, "logits must be [S, V] float32");
  const int64_t rows = x.size(0), v = x.size(1);
  auto argmax = torch::empty({rows}, x.options().dtype(torch::kLong));
  auto max = torch::empty({rows}, x.options());
  auto log_sum = torch::empty({rows}, x.options());
  const auto& t = table_for(isa);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
    t.row_stats(xp, v, argmax.data_ptr<int64_t>(), max.data_ptr<float>(), log_sum.data_ptr<float>(), b, e);
  });
  return {argmax, max, log_sum};
}

// gate_up [T, 2I] float32 or bfloat16 -> silu(gate) * up (GELU-tanh(gate) * up when ``gelu``), [T, I] float32
torch::Tensor silu_mul(const std::string& isa, const torch::Tensor& gate_up, bool gelu) {
  check_cpu(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up must be [T, 2I]");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = torch::empty({rows, inter}, gate_up.options().dtype(torch::kFloat32));
  const auto& t = table_for(isa);
  float* o = out.data_ptr<float>();
  if (gate_up.scalar_type() == torch::kFloat32) {
    nxk::run_silu_mul(t, gate_up.data_ptr<float>(), rows, inter, o, gelu);
  } else {
    TORCH_CHECK(gate_up.scalar_type() == torch::kBFloat16, "gate_up must be float32 or bfloat16");
    nxk::run_silu_mul(t, reinterpret_cast<const uint16_t*>(gate_up.data_ptr<at::BFloat16>()), rows, inter, o, gelu);
  }
  return out;
}

template <class T, class C = T>
nxk::AttentionArgs<T, C> attention_args(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& tables,
                                     const torch::Tensor& owners, const torch::Tensor& positions,
                                     double scale, int64_t window, double softcap, torch::Tensor& out) {
  return nxk::AttentionArgs<T, C>{
      reinterpret_cast<const T*>(q.data_ptr()),
      reinterpret_cast<const C*>(k_cache.data_ptr()),
      reinterpret_cast<const C*>(v_cache.data_ptr()),
      tables.data_ptr<int64_t>(),
      tables.size(1),
      owners.data_ptr<int64_t>(),
      positions.data_ptr<int64_t>(),
      q.size(1),
      k_cache.size(1),
      q.size(2),
      k_cache.size(2),
      static_cast<float>(scale),
      window,
      static_cast<float>(softcap),
      out.data_ptr<float>(),
      nxk::keys_by_dimension(k_cache),
  };
}

// q [rows, H, d]; k_cache, v_cache [blocks, Hkv, block, d] (q's dtype, or float16 or int8 under float32 q; int8
// with its k_scales and v_scales, cache_layout.h); tables [R, nb] long; owners, positions [rows] long ->
// [rows, H, d] float32
torch::Tensor attention(const std::string& isa, const torch::Tensor& q, const torch::Tensor& k_cache,
                        const torch::Tensor& v_cache, const torch::Tensor& tables, const torch::Tensor& owners,
                        const torch::Tensor& positions, double scale, int64_t window, double softcap,
                        const c10::optional<torch::Tensor>& k_scales, const c10::optional<torch::Tensor>& v_scales) {
  for (const auto* t : {&q, &v_cache, &tables, &owners, &positions}) check_cpu(*t, "attention input");
  nxk::check_key_cache(k_cache);
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "attention shapes");
  const bool float_q = q.scalar_type() == torch::kFloat32;
  const bool half_cache = float_q && k_cache.scalar_type() == torch::kHalf;
  const bool int8_cache = float_q && k_cache.scalar_type() == torch::kChar;
  TORCH_CHECK((q.scalar_type() == k_cache.scalar_type() || half_cache || int8_cache) &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "the cache must be in q's dtype (or float16 or int8 under float32 q), K and V alike");
  const std::pair<nxk::Half*, nxk::Half*> scales = nxk::cache_scales(k_cache, v_cache, k_scales, v_scales);
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(2) % nxk::kLanes == 0 && q.size(2) <= nxk::kMaxHeadDim,
              "head_dim must match the cache, be a multiple of ", nxk::kLanes, " and at most ", nxk::kMaxHeadDim);
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(tables.scalar_type() == torch::kLong && owners.scalar_type() == torch::kLong &&
                  positions.scalar_type() == torch::kLong,
              "tables, owners and positions must be int64");
  const int64_t rows = q.size(0);
  TORCH_CHECK(owners.numel() == rows && positions.numel() == rows, "one owner and position per query row");
  auto out = torch::empty({rows, q.size(1), q.size(2)}, q.options().dtype(torch::kFloat32));
  const auto& t = table_for(isa);
  if (half_cache) {
    nxk::run_attention(
        t, attention_args<float, nxk::Half>(q, k_cache, v_cache, tables, owners, positions, scale, window, softcap, out),
        rows);
  } else if (int8_cache) {
    auto args = attention_args<float, int8_t>(q, k_cache, v_cache, tables, owners, positions, scale, window, softcap, out);
    args.k_scales = scales.first;
    args.v_scales = scales.second;
    nxk::run_attention(t, args, rows);
  } else if (q.scalar_type() == torch::kFloat32) {
    nxk::run_attention(t, attention_args<float>(q, k_cache, v_cache, tables, owners, positions, scale, window, softcap, out),
                       rows);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "attention takes float32 or bfloat16");
    nxk::run_attention(
        t, attention_args<uint16_t>(q, k_cache, v_cache, tables, owners, positions, scale, window, softcap, out), rows);
  }
  return out;
}

// RoPE on qk [N, heads + kv_heads, d] float32 (query heads, then key heads) -> the rotated queries
// [N, heads, d]; each row's rotated keys and its values v [N, kv_heads, d] written at its slot of the
// caches [blocks, kv_heads, block, d] (float32, float16 or int8 with its scales, in place; K in either layout,
// cache_layout.h)
torch::Tensor rope(const std::string& isa, const torch::Tensor& qk, const torch::Tensor& v, const torch::Tensor& cos,
                   const torch::Tensor& sin, const torch::Tensor& slots, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                   const c10::optional<torch::Tensor>& k_scales, const c10::optional<torch::Tensor>& v_scales) {
  for (const auto* t : {&qk, &v, &cos, &sin, &slots, &v_cache}) check_cpu(*t, "rope input");
  nxk::check_key_cache(k_cache);
  for (const auto* t : {&qk, &v, &cos, &sin})
    TORCH_CHECK(t->scalar_type() == torch::kFloat32, "qk, v, cos and sin must be float32");
  TORCH_CHECK(slots.scalar_type() == torch::kLong, "slots must be int64");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type(),
              "caches must be [blocks, kv_heads, block, d], K and V alike");
  const int64_t rows = qk.size(0), kv_heads = k_cache.size(1), block = k_cache.size(2), d = k_cache.size(3);
  TORCH_CHECK(qk.dim() == 3 && qk.size(2) == d && d % 2 == 0 && d <= nxk::kMaxHeadDim && qk.size(1) > kv_heads,
              "qk must be [N, heads + kv_heads, d], d even");
  const int64_t heads = qk.size(1) - kv_heads;
  TORCH_CHECK(v.dim() == 3 && v.size(0) == rows && v.size(1) == kv_heads && v.size(2) == d, "v must be [N, kv_heads, d]");
  TORCH_CHECK(cos.numel() == rows * d && sin.numel() == rows * d && slots.numel() == rows,
              "one cos and sin row and one slot per row");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    TORCH_CHECK(slot[r] >= 0 && slot[r] < k_cache.size(0) * block, "slot out of the cache");
  const std::pair<nxk::Half*, nxk::Half*> scales = nxk::cache_scales(k_cache, v_cache, k_scales, v_scales);
  auto q = torch::empty({rows, heads, d}, qk.options());
  const auto& t = table_for(isa);
  const auto run = [&](auto* kc, auto* vc) {
    using C = std::remove_pointer_t<decltype(kc)>;
    const nxk::RopeRows<C> a{qk.data_ptr<float>(), (heads + kv_heads) * d, v.data_ptr<float>(), kv_heads * d,
                             cos.data_ptr<float>(), sin.data_ptr<float>(), slot, heads, kv_heads, d, block,
                             q.data_ptr<float>(), kc, vc, nxk::keys_by_dimension(k_cache), scales.first, scales.second};
    nxk::run_rope(t, a, rows, 1);
  };
  if (k_cache.scalar_type() == torch::kHalf) {
    run(reinterpret_cast<nxk::Half*>(k_cache.data_ptr<at::Half>()), reinterpret_cast<nxk::Half*>(v_cache.data_ptr<at::Half>()));
  } else if (k_cache.scalar_type() == torch::kChar) {
    run(k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>());
  } else {
    TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32, "caches must be float32, float16 or int8");
    run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  }
  return q;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nxctl's fixed-order CPU kernels (see kernels.h for the order of every reduction)";
  m.def("cpu_features", &nxk::cpu_features, "the features of this CPU among those the tables use (lower case)");
  m.def("cpu_has_avx2", &nxk::cpu_has_avx2, "whether this CPU has AVX2, FMA and F16C (the avx2 table)");
  m.def("cpu_has_avx512", &nxk::cpu_has_avx512, "whether this CPU has AVX512F besides AVX2, FMA and F16C (avx512)");
  m.def("cpu_has_avx512_vnni", &nxk::cpu_has_avx512_vnni,
        "whether this CPU has AVX512F, BW, VL and VNNI besides AVX2, FMA and F16C (avx512_vnni)");
  m.def("linear", &linear, "y = x @ W^T over a packed [P, K, 16] weight, float32 out");
  m.def("qlinear", &qlinear, "y = x @ W^T over a packed quantized weight (quantized.h), float32 out");
  m.def("quantized_rows", &quantized_rows, "rows of a packed quantized weight as float32 (an embedding lookup)");
  m.def("repack_quantized", &repack_quantized, "GGUF blocks (parts stacked) as a packed quantized weight (repack.h)",
        py::arg("parts"), py::arg("n"), py::arg("k"), py::arg("format"), py::arg("order") = py::none());
  m.def("pack_panels", &pack_panels, "rows of 16- or 32-bit values (parts stacked) as [P, K, 16] panels");
  m.def("rms_norm", &rms_norm, "x / rms(x) per row, float32 out");
  m.def("softmax", &softmax, "softmax or log-softmax per row");
  m.def("row_stats", &row_stats, "each row's argmax and the max and log-sum of its log-softmax");
  m.def("silu_mul", &silu_mul, "silu(gate) * up (or GELU-tanh) per row of [gate | up]");
  m.def("rope", &rope, "RoPE on query and key heads; keys and values written to the paged cache", py::arg("isa"),
        py::arg("qk"), py::arg("v"), py::arg("cos"), py::arg("sin"), py::arg("slots"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("k_scales") = py::none(), py::arg("v_scales") = py::none());
  m.def("attention", &attention, "causal attention over the paged cache, read in place", py::arg("isa"), py::arg("q"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("tables"), py::arg("owners"), py::arg("positions"),
        py::arg("scale"), py::arg("window"), py::arg("softcap"), py::arg("k_scales") = py::none(),
        py::arg("v_scales") = py::none());
  py::class_<nxk::DecoderStack>(m, "DecoderStack", "every decoder layer over a step's rows in one call (decoder.h)")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double, int64_t>(), py::arg("hidden"),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("intermediate"), py::arg("eps"),
           py::arg("scale"), py::arg("window") = 0)
      .def("add_layer", &nxk::DecoderStack::add_layer)
      .def("split_linear", &nxk::DecoderStack::split_linear)
      .def("forward", &nxk::DecoderStack::forward)
      .def_property_readonly("num_layers", &nxk::DecoderStack::num_layers);
  m.attr("PANEL") = nxk::kPanel;
  m.attr("LANES") = nxk::kLanes;
  m.attr("QBLOCK") = nxk::kQBlock;
  // the base formats by name, for quant_pack.py's mirror of them (tests compare the two)
  const std::pair<const char*, nxk::QFormat> formats[] = {
      {"Q8", nxk::kQ8},   {"Q4", nxk::kQ4},   {"Q4S", nxk::kQ4S}, {"Q8S", nxk::kQ8S}, {"Q5S", nxk::kQ5S},
      {"I4", nxk::kI4},   {"I4S", nxk::kI4S}, {"Q3S", nxk::kQ3S}, {"Q2S", nxk::kQ2S}, {"Q5", nxk::kQ5},
      {"Q5Z", nxk::kQ5Z}, {"Q4Z", nxk::kQ4Z}};
  for (const auto& [name, format] : formats) m.attr(name) = static_cast<int64_t>(format);
  m.attr("DOT_FORMATS") = static_cast<int64_t>(nxk::kDotFormats);
  m.attr("Q8_TILE_BYTES") = nxk::tile_bytes(nxk::kQ8);
  m.attr("Q4_TILE_BYTES") = nxk::tile_bytes(nxk::kQ4);
}
