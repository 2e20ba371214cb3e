// Causal self-attention's core, as the model runs it outside context
// parallelism: softmax(q k^T * scale + causal mask) v per (batch, head), the
// products through BatchedMatmul and the softmax in fp32. One definition for
// the model (stages.cc), the ring (ring_attention.cc: the mask and the
// key/value heads' repetition) and bench/kernels, which measures it against
// LibTorch 2.11's scaled_dot_product_attention.
#ifndef BATON_WORKER_MODEL_ATTENTION_H_
#define BATON_WORKER_MODEL_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace baton {

// [len, len] of 0 on and below the diagonal and -inf above it, in `dtype`.
at::Tensor CausalMask(int64_t len, at::ScalarType dtype, at::Device device = at::kCPU);

// Key/value heads ([b, kv_heads, t, hd]) repeated to the query heads they
// serve, each `group` times in a row (grouped-query attention; autograd sums
// the query heads' gradients back onto them).
at::Tensor RepeatHeads(const at::Tensor& x, int64_t group);

// q [b, heads, t, hd]; k, v [b, kv_heads, t, hd] with kv_heads dividing heads.
// Returns [b, heads, t, hd] in q's dtype.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_ATTENTION_H_
