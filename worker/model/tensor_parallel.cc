#include "worker/model/tensor_parallel.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/redistribute.h"

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// One collective step along the tp axis: `from` -> `to` of a tensor whose
// Shard dim is `dim` (resolved from -1 by the caller).
enum Step : int64_t {
  kIdentity,
  kAllReduce,       // Partial -> Replicate
  kAllGather,       // Shard(dim) -> Replicate
  kReduceScatter,   // Partial -> Shard(dim)
  kChunk,           // Replicate -> Shard(dim)
  kPadPartial,      // Shard(dim) -> Partial (own chunk, zeros elsewhere)
};

at::Tensor Run(Step step, const at::Tensor& x, int64_t dim, Communicator& comm, Milliseconds timeout) {
  const int n = comm.size();
  std::vector<int64_t> shape = x.sizes().vec();
  Placement from = Placement::Replicate(), to = Placement::Replicate();
  switch (step) {
    case kIdentity: return x;
    case kAllReduce: from = Placement::Partial(); break;
    case kAllGather: from = Placement::Shard(dim); shape[dim] *= n; break;
    case kReduceScatter: from = Placement::Partial(); to = Placement::Shard(dim); break;
    case kChunk: to = Placement::Shard(dim); break;
    case kPadPartial: from = Placement::Shard(dim); to = Placement::Partial(); shape[dim] *= n; break;
  }
  // Sums in fp32 whatever the activations' dtype.
  const bool reduces = from.is_partial();
  const at::Tensor in = reduces && x.scalar_type() != at::kFloat ? x.to(at::kFloat) : x.contiguous();
  auto out = Redistribute(in, shape, from, to, comm, timeout);
  TORCH_CHECK(out.ok(), "tensor parallel ", from.ToString(), " -> ", to.ToString(), ": ", out.status().ToString());
  return out->scalar_type() == x.scalar_type() ? *out : out->to(x.scalar_type());
}

// Forward `fwd`, backward `bwd`, along one communicator. The communicator
// is kept as a raw pointer in the autograd context: the Executor's Groups own
// it and outlive every graph a step builds (Activations drops them when the
// next step begins).
class TpFunction : public torch::autograd::Function<TpFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t fwd, int64_t bwd, int64_t dim,
                            int64_t comm, int64_t timeout_ms) {
    ctx->saved_data["bwd"] = bwd;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["timeout"] = timeout_ms;
    at::NoGradGuard no_grad;
    return Run(static_cast<Step>(fwd), x, dim, *reinterpret_cast<Communicator*>(comm), Milliseconds(timeout_ms));
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    at::Tensor g = Run(static_cast<Step>(ctx->saved_data["bwd"].toInt()), grads[0], ctx->saved_data["dim"].toInt(),
                       *comm, Milliseconds(ctx->saved_data["timeout"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor Apply(const at::Tensor& x, Step fwd, Step bwd, int64_t dim, const TensorParallelGroup& tp) {
  return TpFunction::apply(x, static_cast<int64_t>(fwd), static_cast<int64_t>(bwd), dim,
                           reinterpret_cast<int64_t>(tp.comm), static_cast<int64_t>(tp.timeout.count()));
}

constexpr int64_t kSequenceDim = 1;  // activations are (batch, sequence, features)

}  // namespace

at::Tensor CopyToTensorParallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return Apply(x, kIdentity, kAllReduce, 0, tp);
}

at::Tensor ReduceFromTensorParallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return Apply(x, kAllReduce, kIdentity, 0, tp);
}

at::Tensor GatherSequence(const at::Tensor& x, const TensorParallelGroup& tp) {
  return Apply(x, kAllGather, kReduceScatter, kSequenceDim, tp);
}

at::Tensor ReduceScatterSequence(const at::Tensor& x, const TensorParallelGroup& tp) {
  return Apply(x, kReduceScatter, kAllGather, kSequenceDim, tp);
}

at::Tensor ScatterSequence(const at::Tensor& x, const TensorParallelGroup& tp) {
  return Apply(x, kChunk, kPadPartial, kSequenceDim, tp);
}

at::Tensor GatherVocab(const at::Tensor& x, const TensorParallelGroup& tp) {
  return Apply(x, kAllGather, kChunk, x.dim() - 1, tp);
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets, const TensorParallelGroup& tp) {
  const int64_t vocab_local = logits.size(-1);
  // The max only keeps exp() in range; no gradient flows through it.
  at::Tensor max = std::get<0>(logits.detach().max(-1)).contiguous();
  const absl::Status reduced = tp.comm->AllReduce(max, ReduceOp::kMax, tp.timeout);
  TORCH_CHECK(reduced.ok(), "tensor parallel max of the logits: ", reduced.ToString());
  at::Tensor shifted = logits.sub(max.unsqueeze(-1));
  at::Tensor sum_exp = ReduceFromTensorParallel(shifted.exp().sum(-1), tp);
  const int64_t offset = tp.rank() * vocab_local;
  at::Tensor mine = targets.ge(offset).logical_and(targets.lt(offset + vocab_local));
  at::Tensor index = targets.sub(offset).masked_fill(mine.logical_not(), 0).unsqueeze(-1);
  at::Tensor picked = shifted.gather(-1, index).squeeze(-1).mul(mine.to(shifted.scalar_type()));
  at::Tensor target_logit = ReduceFromTensorParallel(picked, tp);
  return sum_exp.log().sub(target_logit).mean();
}

}  // namespace baton
