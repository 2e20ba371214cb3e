// Megatron tensor parallelism inside a stage: the collectives each block
// needs, as autograd functions, so backward inserts their conjugates by
// itself. Each is a redistribute (worker/redistribute.h) along the tp axis
// forward and another backward:
//
//   CopyToTensorParallel      f: Replicate -> Replicate   | grad Partial -> Replicate (all-reduce)
//   ReduceFromTensorParallel  g: Partial -> Replicate     | grad passes through
//   GatherSequence            Shard(1) -> Replicate       | grad Partial -> Shard(1) (reduce-scatter)
//   ReduceScatterSequence     Partial -> Shard(1)         | grad Shard(1) -> Replicate (all-gather)
//   ScatterSequence           Replicate -> Shard(1)       | grad Shard(1) -> Partial (zeros elsewhere)
//   GatherVocab               Shard(-1) -> Replicate      | grad Replicate -> Shard(-1) (local chunk)
//
// Reductions run in fp32 whatever the activations' dtype. Splits are even
// (the planner checks divisibility). Failures throw (c10::Error), as any
// LibTorch op inside a stage does; the Executor turns them into a Status.
#ifndef BATON_WORKER_MODEL_TENSOR_PARALLEL_H_
#define BATON_WORKER_MODEL_TENSOR_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "worker/comm/communicator.h"

namespace baton {

// One stage's tensor-parallel group on this rank: the communicator along the
// tp axis, the stage's sequence and loss parallelism, and which weights are
// split. (baton.v1.TensorParallel is the job file's plan; the regions a
// stage splits are the model definition's, models/model.h.)
struct TensorParallelGroup {
  Communicator* comm = nullptr;  // the group along the tp axis
  bool sequence_parallel = false;
  bool loss_parallel = false;
  Milliseconds timeout = kDefaultCollectiveTimeout;
  // Whether a parameter is split along the tp axis.
  std::function<bool(const std::string&)> split;

  int size() const { return comm->size(); }
  int rank() const { return comm->rank(); }
};

at::Tensor CopyToTensorParallel(const at::Tensor& x, const TensorParallelGroup& tp);
at::Tensor ReduceFromTensorParallel(const at::Tensor& x, const TensorParallelGroup& tp);
at::Tensor GatherSequence(const at::Tensor& x, const TensorParallelGroup& tp);
at::Tensor ReduceScatterSequence(const at::Tensor& x, const TensorParallelGroup& tp);
at::Tensor ScatterSequence(const at::Tensor& x, const TensorParallelGroup& tp);
at::Tensor GatherVocab(const at::Tensor& x, const TensorParallelGroup& tp);

// Mean cross-entropy of fp32 logits whose last dim is this rank's contiguous
// share of the vocabulary, without gathering them: the max, the sum of
// exponentials and the target logit are reduced over the tp ranks instead.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets, const TensorParallelGroup& tp);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_TENSOR_PARALLEL_H_
