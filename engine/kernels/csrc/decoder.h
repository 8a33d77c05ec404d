// The decoder's layer loop in C++: one call runs every layer of a Llama-family stack over a step's
// rows, so the Python work per step does not grow with the layer count and no tensor is allocated
// per layer (the step's scratch buffers are kept and reused from step to step).
//
// The same kernels as the layer-by-layer Python path (ops.h launchers), and the same elementwise float32
// operations in the same order (a product and a sum are each rounded once: the build never contracts
// them into a fused multiply-add), so the two paths give the same bits; the tests compare them. The
// elementwise work between kernels (residual adds, RMSNorm's weight, RoPE, cache writes) is split
// between threads by rows, the residual add in one pass with the norm that follows it: rows are
// independent there, so the split changes no bit.
#pragma once

#include <torch/extension.h>

#include <string>
#include <vector>

namespace nxk {

// One linear weight as the engine holds it: packed float panels [P, K, 16] (float32, bfloat16 or float16,
// format < 0) or packed quantized tiles [P, K / 32, tile bytes] uint8 in ``format`` (quantized.h).
// ``context_format``: the format a step's context rows (see forward) multiply it in: ``format``, or
// for a weight in the int16 dot layout the int8 one (qdot.h: the same bytes).
// ``segments``: a linear held in parts of different quantized types (engine/layers/segmented_linear.py),
// each a HeldLinear of its own, their outputs side by side in order (``data`` is then empty).
struct HeldLinear {
  torch::Tensor data;
  int64_t format, context_format;
  int64_t n, k;  // logical [N, K]
  std::vector<HeldLinear> segments;
};

struct DecoderLayer {
  torch::Tensor input_norm, post_norm;  // [hidden] float32
  HeldLinear qkv, o, gate_up, down;     // [q + 2 kv, hidden], [hidden, q], [2 inter, hidden], [hidden, inter]
  torch::Tensor k_cache, v_cache;       // [blocks, kv_heads, block, head_dim] float32, float16 or int8
  torch::Tensor k_scales, v_scales;     // an int8 cache's scales (kv_int8.h, cache_layout.h), else empty
  torch::Tensor qkv_bias;               // [q + 2 kv] float32, or empty (no bias)
  torch::Tensor q_norm, k_norm;         // [head_dim] float32 each, or empty (no per-head norm)
};

class DecoderStack {
 public:
  // window > 0: each row sees only the last ``window`` positions (a sliding window)
  DecoderStack(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
               double scale, int64_t window);

  // Appends a layer (mutates). Weights and caches are held by reference: the tensors' contents may
  // change between steps; a replaced tensor needs a new stack. An empty qkv_bias, q_norm or k_norm
  // means the family has none (families differ by data, not by code). context_formats: the formats of
  // qkv, o, gate_up and down for context rows (HeldLinear), or empty: their own formats. k_scales and
  // v_scales: an int8 cache's scales, empty tensors for a float cache.
  void add_layer(const torch::Tensor& input_norm, const torch::Tensor& qkv, int64_t qkv_format, const torch::Tensor& o,
                 int64_t o_format, const torch::Tensor& post_norm, const torch::Tensor& gate_up,
                 int64_t gate_up_format, const torch::Tensor& down, int64_t down_format, const torch::Tensor& k_cache,
                 const torch::Tensor& v_cache, const torch::Tensor& k_scales, const torch::Tensor& v_scales,
                 const torch::Tensor& qkv_bias, const torch::Tensor& q_norm,
                 const torch::Tensor& k_norm, const std::vector<int64_t>& context_formats);

  // The last layer's linear ``which`` (0 qkv, 1 o, 2 gate_up, 3 down; add_layer was given an empty
  // tensor for it) held as segments: datas[i] in formats[i] (context rows in context_formats[i]), ns[i]
  // output columns each, summing to the linear's N (mutates).
  void split_linear(int64_t which, const std::vector<torch::Tensor>& datas, const std::vector<int64_t>& formats,
                    const std::vector<int64_t>& context_formats, const std::vector<int64_t>& ns);

  // Every layer over the step's rows: x [N, hidden] float32 (the embeddings) -> [N - context_rows,
  // hidden] float32 (the leading rows of a new tensor), writing each row's K/V at its slot. slots,
  // positions, owners [N] long; cos, sin [N, head_dim] float32 (RoPE rows, rotate-half layout); tables
  // [R, nb] long block tables. The last ``context_rows`` rows are context rows: each linear multiplies
  // them in its context_format, the others in its format (two calls over the weight, each row's output
  // its own either way). Nothing reads a context row's output, only its K/V: the last layer writes
  // their K/V and stops there, and the result leaves them out.
  torch::Tensor forward(const std::string& isa, const torch::Tensor& x, const torch::Tensor& slots,
                        const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& tables,
                        const torch::Tensor& owners, const torch::Tensor& positions, int64_t context_rows);

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  HeldLinear held(const torch::Tensor& data, int64_t format, int64_t context_format, int64_t n, int64_t k) const;

  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_, window_;
  double eps_, scale_;
  std::vector<DecoderLayer> layers_;
  // scratch for one step, reused: sized for the largest step seen so far
  std::vector<float> h_, qkv_, q_, attn_, tmp_, gate_up_, act_, heads_normed_, heads_rms_;
};

}  // namespace nxk
