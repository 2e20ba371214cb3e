// Rotary positions, as Meta's Llama: feature pairs (x[2i], x[2i+1]) of each
// head at position t turned by the angle t * theta^(-2i / head_dim), in fp32
// whatever the compute dtype: out = x * cos + swap(x) * sin, swap exchanging
// each pair's features, with the tables interleaved (cos_i twice; -sin_i,
// +sin_i): bit for bit the complex product's a cos - b sin, b cos + a sin.
//
// In fp32 with an even head_dim, Rotate is one pass over q or k forward and
// one over its gradient backward (lane-wise vector code, vec.h), where
// LibTorch's operators took a flip, two products, a sum and their
// gradients: the same operations in the same order, so the same bits
// (rotary_test), at a quarter of the time (bench/kernels). Other dtypes and
// an odd head_dim (whose last feature has no partner and passes through
// unturned, as partial rotary embeddings do) take the operators.
#ifndef BATON_WORKER_MODEL_ROTARY_H_
#define BATON_WORKER_MODEL_ROTARY_H_

#include <ATen/core/Tensor.h>

#include <utility>

namespace baton {

// The angles' cos and sin for `positions` (int64: a row's positions, or
// this rank's of them under context parallelism), computed as Meta's
// precompute_freqs_cis does, in float32 (1 / theta^(2i / hd), times t),
// interleaved as Rotate takes them: [positions, 2 * (head_dim / 2)] each.
std::pair<at::Tensor, at::Tensor> RotaryTables(const at::Tensor& positions, int64_t head_dim, double theta);

// `x`: [batch, heads, seq, head_dim] (any strides); `cos`, `sin`: from
// RotaryTables for its seq positions. Differentiable in x.
at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The same with LibTorch's operators (the fallback, and what tests and the
// bench compare with).
at::Tensor RotateByOperators(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_ROTARY_H_
