// The decoder stack's layer loop (see decoder.h for what it promises).
#include "decoder.h"

#include <cstring>
#include <type_traits>

#include "cache_layout.h"
#include "ops.h"

namespace nxk {
namespace {

void check_float(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == torch::kFloat32, what,
              " must be a contiguous float32 CPU tensor");
}

void check_long(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == torch::kLong, what,
              " must be a contiguous int64 CPU tensor");
}

void check_cpu(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), what, " must be a contiguous CPU tensor");
}

// a cache as the kernels read and write it (float16 as nxk::Half: its bits)
float* kernel_view(float* cache) { return cache; }
Half* kernel_view(at::Half* cache) { return reinterpret_cast<Half*>(cache); }
int8_t* kernel_view(int8_t* cache) { return cache; }

// fn(k, v) with a layer's caches as typed pointers (float*, at::Half* or int8_t*), resolved once per layer
template <class F>
void with_caches(const DecoderLayer& layer, const F& fn) {
  if (layer.k_cache.scalar_type() == torch::kHalf) {
    fn(layer.k_cache.data_ptr<at::Half>(), layer.v_cache.data_ptr<at::Half>());
  } else if (layer.k_cache.scalar_type() == torch::kChar) {
    fn(layer.k_cache.data_ptr<int8_t>(), layer.v_cache.data_ptr<int8_t>());
  } else {
    fn(layer.k_cache.data_ptr<float>(), layer.v_cache.data_ptr<float>());
  }
}

// y [M, N] = x [M, K] @ W^T through the kernel for the weight's layout; the last ``context`` rows in
// the weight's context_format
void apply(const KernelTable& t, const HeldLinear& w, const float* x, int64_t m, float* y, int64_t context) {
  if (!w.segments.empty()) {  // each segment into scratch, then into its columns of y
    thread_local std::vector<float> part;
    int64_t col = 0;
    for (const HeldLinear& s : w.segments) {
      part.resize(static_cast<size_t>(m * s.n));
      apply(t, s, x, m, part.data(), context);
      for (int64_t r = 0; r < m; ++r) std::copy_n(part.data() + r * s.n, s.n, y + r * w.n + col);
      col += s.n;
    }
    return;
  }
  if (w.format >= 0) {
    const int64_t own = w.context_format == w.format ? m : m - context;  // rows in the weight's own format
    const uint8_t* packed = w.data.data_ptr<uint8_t>();
    run_qlinear(t, x, own, w.k, packed, w.format, w.n, y);
    run_qlinear(t, x + own * w.k, m - own, w.k, packed, w.context_format, w.n, y + own * w.n);
  } else if (w.data.scalar_type() == torch::kFloat32) {
    run_linear(t, x, m, w.k, w.data.data_ptr<float>(), w.n, y);
  } else if (w.data.scalar_type() == torch::kHalf) {
    run_linear(t, x, m, w.k, kernel_view(w.data.data_ptr<at::Half>()), w.n, y);
  } else {
    run_linear(t, x, m, w.k, reinterpret_cast<const uint16_t*>(w.data.data_ptr<at::BFloat16>()), w.n, y);
  }
}

// Rows per share when the elementwise work of a step (residual adds, norms, RoPE, cache writes) is split
// between threads: a decode step of a few rows stays on the calling thread, a larger step is shared, so
// the other threads no longer wait through it. Rows are independent here, so the split changes no bit.
constexpr int64_t kRowGrain = 8;

// rows [b, e) of x [N, D] += y [N, D]
void add_rows(float* x, const float* y, int64_t d, int64_t b, int64_t e) {
  for (int64_t i = b * d; i < e * d; ++i) x[i] = x[i] + y[i];
}

// x [N, D] += y [N, D] when y is given, then h [N, D] = (x / rms(x)) * weight: the kernel's normalised
// rows, then one rounded product each; rows shared between threads
void add_and_norm(const KernelTable& t, float* x, const float* y, int64_t rows, int64_t d, double eps,
                  const torch::Tensor& weight, float* h) {
  const float* w = weight.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
    if (y != nullptr) add_rows(x, y, d, b, e);
    t.rms_norm_f32(x, d, static_cast<float>(eps), h, b, e);
    for (int64_t r = b; r < e; ++r)
      for (int64_t i = 0; i < d; ++i) h[r * d + i] = h[r * d + i] * w[i];
  });
}

// x [N, D] += y [N, D], rows shared between threads
void add_into(float* x, const float* y, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) { add_rows(x, y, d, b, e); });
}

}  // namespace

DecoderStack::DecoderStack(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate,
                           double eps, double scale, int64_t window)
    : hidden_(hidden),
      heads_(heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      intermediate_(intermediate),
      window_(window),
      eps_(eps),
      scale_(scale) {
  TORCH_CHECK(hidden > 0 && heads > 0 && kv_heads > 0 && intermediate > 0, "stack sizes must be positive");
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(head_dim % kLanes == 0 && head_dim <= kMaxHeadDim, "head_dim must be a multiple of ", kLanes,
              " and at most ", kMaxHeadDim);
}

HeldLinear DecoderStack::held(const torch::Tensor& data, int64_t format, int64_t context_format, int64_t n,
                              int64_t k) const {
  if (data.numel() == 0) return HeldLinear{data, format, context_format, n, k, {}};  // split_linear's to give
  TORCH_CHECK(data.device().is_cpu() && data.is_contiguous() && data.dim() == 3, "a held linear must be a contiguous ",
              "3-d CPU tensor");
  TORCH_CHECK(data.size(0) == (n + kPanel - 1) / kPanel, "a held linear does not hold N=", n);
  if (format >= 0) {
    TORCH_CHECK(format < kFormats, "unknown quantized format ", format);
    const int64_t group = group_blocks(format);
    TORCH_CHECK(data.scalar_type() == torch::kUInt8 && data.size(1) * kQBlock * group == k &&
                    data.size(2) == group_bytes(format),
                "a quantized linear must be [P, ", k / (kQBlock * group), ", ", group_bytes(format), "] uint8");
    TORCH_CHECK(context_format == format || (is_wide_format(format) && context_format == format - kDotFormats),
                "a context format must be the weight's own or, for int16 inputs, int8 ones");
  } else {
    TORCH_CHECK(context_format == format, "a float linear has no context format of its own");
    TORCH_CHECK(data.scalar_type() == torch::kFloat32 || data.scalar_type() == torch::kBFloat16 ||
                    data.scalar_type() == torch::kHalf,
                "a packed linear must be float32, bfloat16 or float16");
    TORCH_CHECK(data.size(1) == k && data.size(2) == kPanel, "a packed linear must be [P, ", k, ", 16]");
  }
  return HeldLinear{data, format, context_format, n, k, {}};
}

void DecoderStack::split_linear(int64_t which, const std::vector<torch::Tensor>& datas,
                                const std::vector<int64_t>& formats, const std::vector<int64_t>& context_formats,
                                const std::vector<int64_t>& ns) {
  TORCH_CHECK(!layers_.empty() && which >= 0 && which < 4, "split_linear: a linear (0..3) of a layer added");
  DecoderLayer& layer = layers_.back();
  HeldLinear* w[4] = {&layer.qkv, &layer.o, &layer.gate_up, &layer.down};
  HeldLinear& whole = *w[which];
  TORCH_CHECK(whole.data.numel() == 0 && whole.segments.empty(), "split_linear: add_layer gave that linear a weight");
  TORCH_CHECK(!datas.empty() && datas.size() == formats.size() && datas.size() == context_formats.size() &&
                  datas.size() == ns.size(),
              "split_linear: one format, context format and width per segment");
  int64_t total = 0;
  for (size_t i = 0; i < datas.size(); ++i) {
    TORCH_CHECK(datas[i].numel() > 0, "split_linear: an empty segment");
    whole.segments.push_back(held(datas[i], formats[i], context_formats[i], ns[i], whole.k));
    total += ns[i];
  }
  TORCH_CHECK(total == whole.n, "split_linear: the segments hold ", total, " columns of the linear's ", whole.n);
}

void DecoderStack::add_layer(const torch::Tensor& input_norm, const torch::Tensor& qkv, int64_t qkv_format,
                             const torch::Tensor& o, int64_t o_format, const torch::Tensor& post_norm,
                             const torch::Tensor& gate_up, int64_t gate_up_format, const torch::Tensor& down,
                             int64_t down_format, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                             const torch::Tensor& k_scales, const torch::Tensor& v_scales, const torch::Tensor& qkv_bias, const torch::Tensor& q_norm, const torch::Tensor& k_norm,
                             const std::vector<int64_t>& context_formats) {
  check_float(input_norm, "input norm");
  check_float(post_norm, "post-attention norm");
  TORCH_CHECK(input_norm.numel() == hidden_ && post_norm.numel() == hidden_, "norm weights must be [hidden]");
  check_key_cache(k_cache);
  check_cpu(v_cache, "V cache");
  for (const auto* cache : {&k_cache, &v_cache}) {
    TORCH_CHECK(cache->scalar_type() == torch::kFloat32 || cache->scalar_type() == torch::kHalf ||
                    cache->scalar_type() == torch::kChar,
                "KV caches must be float32, float16 or int8");
  }
  (void)cache_scales(k_cache, v_cache, k_scales, v_scales);  // checked here, read per step
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() &&
                  (layers_.empty() || layers_[0].k_cache.scalar_type() == k_cache.scalar_type()),
              "every layer's K and V caches share one dtype");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.size(1) == kv_heads_ &&
                  k_cache.size(3) == head_dim_,
              "caches must be [blocks, kv_heads, block, head_dim]");
  const int64_t q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
  if (qkv_bias.numel() > 0) {
    check_float(qkv_bias, "qkv bias");
    TORCH_CHECK(qkv_bias.numel() == q_size + 2 * kv_size, "the qkv bias must be [q + 2 kv]");
  }
  TORCH_CHECK((q_norm.numel() > 0) == (k_norm.numel() > 0), "q and k norms come together");
  if (q_norm.numel() > 0) {
    check_float(q_norm, "q norm");
    check_float(k_norm, "k norm");
    TORCH_CHECK(q_norm.numel() == head_dim_ && k_norm.numel() == head_dim_, "q and k norms must be [head_dim]");
  }
  TORCH_CHECK(context_formats.empty() || context_formats.size() == 4, "context formats: none, or qkv, o, gate_up, down");
  const auto context = [&](size_t i, int64_t own) { return context_formats.empty() ? own : context_formats[i]; };
  layers_.push_back(DecoderLayer{
      input_norm,
      post_norm,
      held(qkv, qkv_format, context(0, qkv_format), q_size + 2 * kv_size, hidden_),
      held(o, o_format, context(1, o_format), hidden_, q_size),
      held(gate_up, gate_up_format, context(2, gate_up_format), 2 * intermediate_, hidden_),
      held(down, down_format, context(3, down_format), hidden_, intermediate_),
      k_cache,
      v_cache,
      k_scales,
      v_scales,
      qkv_bias,
      q_norm,
      k_norm,
  });
}

torch::Tensor DecoderStack::forward(const std::string& isa, const torch::Tensor& x, const torch::Tensor& slots,
                                    const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& tables,
                                    const torch::Tensor& owners, const torch::Tensor& positions,
                                    int64_t context_rows) {
  const KernelTable& t = table_for(isa);
  check_float(x, "x");
  check_float(cos, "cos");
  check_float(sin, "sin");
  for (const auto* l : {&slots, &tables, &owners, &positions}) check_long(*l, "slots, tables, owners and positions");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == hidden_, "x must be [N, hidden]");
  for (const DecoderLayer& layer : layers_)
    for (const HeldLinear* w : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
      TORCH_CHECK(w->data.numel() > 0 || !w->segments.empty(), "a linear left to split_linear was never given");
  const int64_t rows = x.size(0), d = head_dim_;
  TORCH_CHECK(slots.numel() == rows && owners.numel() == rows && positions.numel() == rows,
              "one slot, owner and position per row");
  TORCH_CHECK(cos.numel() == rows * d && sin.numel() == rows * d, "cos and sin must be [N, head_dim]");
  TORCH_CHECK(tables.dim() == 2, "tables must be [R, nb]");
  TORCH_CHECK(context_rows >= 0 && context_rows <= rows, "context rows must be between 0 and the row count");
  auto out = x.clone();  // [N, hidden]: the residual stream
  const int64_t own_rows = rows - context_rows;  // the rows before the context rows
  if (rows == 0 || layers_.empty()) return out.narrow(0, 0, own_rows);
  const int64_t q_size = heads_ * d, kv_size = kv_heads_ * d, qkv_n = q_size + 2 * kv_size;
  const int64_t block = layers_[0].k_cache.size(2), slot_count = layers_[0].k_cache.size(0) * block;
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) TORCH_CHECK(slot[r] >= 0 && slot[r] < slot_count, "slot out of the KV pool");
  h_.resize(rows * hidden_);
  qkv_.resize(rows * qkv_n);
  q_.resize(rows * q_size);
  attn_.resize(rows * q_size);
  tmp_.resize(rows * hidden_);
  gate_up_.resize(rows * 2 * intermediate_);
  act_.resize(rows * intermediate_);
  heads_normed_.resize(rows * (heads_ + kv_heads_) * d);
  heads_rms_.resize(rows * (heads_ + kv_heads_) * d);
  float* xs = out.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& layer = layers_[l];
    // past its K/V, the last layer runs only the rows whose output is read (context rows come last)
    const bool last = l + 1 == layers_.size();
    const int64_t live = last ? own_rows : rows, context = last ? 0 : context_rows;
    // the previous layer's MLP output joins the residual stream here, in one pass with this norm
    add_and_norm(t, xs, l == 0 ? nullptr : tmp_.data(), rows, hidden_, eps_, layer.input_norm, h_.data());
    apply(t, layer.qkv, h_.data(), rows, qkv_.data(), context_rows);  // [N, q | k | v]
    if (layer.qkv_bias.numel() > 0) {
      const float* bias = layer.qkv_bias.data_ptr<float>();
      at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          for (int64_t i = 0; i < qkv_n; ++i) qkv_[r * qkv_n + i] = qkv_[r * qkv_n + i] + bias[i];
      });
    }
    // the heads of q and k as RoPE reads them: straight from qkv, or normalised head by head
    const float* qk_src = qkv_.data();
    int64_t qk_stride = qkv_n;
    if (layer.q_norm.numel() > 0) {
      const int64_t hk = heads_ + kv_heads_;
      for (int64_t r = 0; r < rows; ++r)  // [N, H + Hkv, d] <- the q | k part of each row
        std::memcpy(heads_normed_.data() + r * hk * d, qkv_.data() + r * qkv_n, hk * d * sizeof(float));
      run_rms_norm(t, heads_normed_.data(), rows * hk, d, static_cast<float>(eps_), heads_rms_.data());
      const float* wq = layer.q_norm.data_ptr<float>();
      const float* wk = layer.k_norm.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t hd = 0; hd < hk; ++hd)
          for (int64_t i = 0; i < d; ++i) {
            const int64_t at = (r * hk + hd) * d + i;
            heads_normed_[at] = heads_rms_[at] * (hd < heads_ ? wq[i] : wk[i]);
          }
      qk_src = heads_normed_.data();
      qk_stride = hk * d;
    }
    with_caches(layer, [&](auto* kc, auto* vc) {
      const auto k_view = kernel_view(kc);
      using C = std::remove_pointer_t<decltype(k_view)>;
      const bool by_dimension = keys_by_dimension(layer.k_cache);
      Half* k_scales = layer.k_scales.numel() > 0 ? reinterpret_cast<Half*>(layer.k_scales.data_ptr<at::Half>()) : nullptr;
      Half* v_scales = layer.v_scales.numel() > 0 ? reinterpret_cast<Half*>(layer.v_scales.data_ptr<at::Half>()) : nullptr;
      const RopeRows<C> rope{qk_src, qk_stride, qkv_.data() + q_size + kv_size, qkv_n, cs, sn, slot, heads_,
                             kv_heads_, d, block, q_.data(), k_view, kernel_view(vc), by_dimension, k_scales, v_scales};
      run_rope(t, rope, rows, kRowGrain);
      const AttentionArgs<float, C> args{
          q_.data(), k_view, kernel_view(vc), tables.data_ptr<int64_t>(), tables.size(1), owners.data_ptr<int64_t>(),
          positions.data_ptr<int64_t>(), heads_, kv_heads_, d, block, static_cast<float>(scale_), window_, 0.0f,
          attn_.data(), by_dimension, k_scales, v_scales};  // [N, heads * d] into attn_
      run_attention(t, args, live);
    });
    if (live == 0) continue;
    apply(t, layer.o, attn_.data(), live, tmp_.data(), context);
    add_and_norm(t, xs, tmp_.data(), live, hidden_, eps_, layer.post_norm, h_.data());
    apply(t, layer.gate_up, h_.data(), live, gate_up_.data(), context);  // [live, gate | up]
    run_silu_mul(t, gate_up_.data(), live, intermediate_, act_.data());
    apply(t, layer.down, act_.data(), live, tmp_.data(), context);  // joins the stream at the next layer's norm
  }
  add_into(xs, tmp_.data(), own_rows, hidden_);  // the last layer's MLP output
  return out.narrow(0, 0, own_rows);  // [N - context_rows, hidden]
}

}  // namespace nxk
