#include "worker/model/attention.h"

#include <ATen/ops/full.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/softmax.h>

#include <limits>

#include "worker/model/batched_matmul.h"

namespace baton {

at::Tensor CausalMask(int64_t len, at::ScalarType dtype, at::Device device) {
  return at::full({len, len}, -std::numeric_limits<float>::infinity(), at::TensorOptions(at::kFloat).device(device))
      .triu(1)
      .to(dtype);
}

at::Tensor RepeatHeads(const at::Tensor& x, int64_t group) {
  return group == 1 ? x : x.repeat_interleave(group, 1);
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  const int64_t group = q.size(1) / k.size(1), t = q.size(2);
  // Scaled and masked in place: the product's backward needs its operands,
  // not its output, and [b, heads, t, t] tensors fresh from the allocator
  // cost their page faults on every call.
  at::Tensor scores = BatchedMatmul(q, RepeatHeads(k, group).transpose(-2, -1));
  scores.mul_(scale).add_(CausalMask(t, scores.scalar_type(), scores.device()));
  const at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(q.scalar_type());
  return BatchedMatmul(probs, RepeatHeads(v, group));
}

}  // namespace baton
