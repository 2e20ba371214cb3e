// Tensor parallelism in the planner (torchtitan's apply_tp): which weight
// each parallel style splits along the tp axis, and a check that follows the
// activations' placements through every tensor-parallel region of the model
// definition (models/model.h) as DTensor would, so a plan that would mix a
// sharded and a plain operand in one op, or feed partial sums through a
// nonlinearity, is refused before any worker runs.
//
//   Linear(x, W):  Replicate x, COLWISE W  -> Shard(-1)    (no communication)
//                  Shard(-1) x, ROWWISE W  -> Partial      (all-reduce, or reduce-scatter
//                                                           to sequence shards, after it)
//                  Replicate x, REPLICATE W -> Replicate
//                  anything else: a planning error naming the module
//
// The Megatron decoder plan this admits: attention.wq/wk/wv COLWISE (whole
// heads per rank), wo ROWWISE; feed_forward.w1/w3 COLWISE, w2 ROWWISE; output
// COLWISE (vocabulary-sharded logits); tok_embeddings REPLICATE or ROWWISE
// (vocabulary-sharded); norms replicated. Each group may also stay whole.
#ifndef BATON_STRATEGIES_TENSOR_PARALLEL_H_
#define BATON_STRATEGIES_TENSOR_PARALLEL_H_

#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "mesh/placement.h"
#include "proto/job.pb.h"
#include "models/model.h"

namespace baton {

struct TensorParallelPlan {
  bool enabled = false;
  std::string axis;
  int size = 1;
  bool sequence_parallel = false;
  bool loss_parallel = false;
  // Every parameter's placement along the tp axis (Replicate when disabled).
  std::map<std::string, Placement> placement;
  // Replicated weights applied to sequence shards (the norms, a whole
  // embedding) under sequence parallelism: their gradients are partial sums
  // over the tp ranks.
  std::set<std::string> grad_partial;
};

// `job` with defaults applied and a valid model and mesh.
absl::StatusOr<TensorParallelPlan> PlanTensorParallel(const baton::v1::JobSpec& job, const ModelLayout& model);

}  // namespace baton

#endif  // BATON_STRATEGIES_TENSOR_PARALLEL_H_
