// The data-parallel planner: FSDP (ZeRO-3), HSDP, ZeRO-1, ZeRO-2 and DDP.
// Turns a validated JobSpec into one Program per rank: the shard layout of
// every parameter and the instruction list the worker's Executor runs each
// step. Pure planning: no sockets, no tensors.
//
// FSDP per microbatch (units reshard after forward, root keeps its params):
//   forward:  GATHER root, WAIT root, [GATHER u+1 (prefetch), WAIT u, FORWARD u, FREE u]...
//   backward: reverse order, re-gathering resharded units; after a unit's last
//             backward stage: FREE, and on the last microbatch
//             REDUCE_SCATTER_GRADS (HSDP: then ALL_REDUCE_GRADS on the replicas).
// then REDUCE_LOSS, CLIP_GRAD_NORM, OPTIMIZER_STEP (on local shards only).
#ifndef BATON_STRATEGIES_PLANNER_H_
#define BATON_STRATEGIES_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "strategies/model_layout.h"

namespace baton {

// What the plan predicts per rank and step, for checking measured figures.
struct PlanTheory {
  int64_t parameters = 0;        // P
  int64_t comm_bytes = 0;        // sent per rank per step (unpadded P)
  int64_t state_bytes = 0;       // params + grads + AdamW moments held per rank
  int64_t root_param_bytes = 0;  // the root unit unsharded, in compute dtype
  int64_t max_unit_param_bytes = 0;  // the largest non-root unit unsharded
};

// `job` must be valid with defaults applied (strategies/job_spec.h).
absl::StatusOr<std::vector<baton::v1::Program>> CompilePrograms(const baton::v1::JobSpec& job,
                                                                const std::string& job_id);
PlanTheory ComputeTheory(const baton::v1::JobSpec& job);

// Whether `unit` frees its gathered parameters after its last forward stage
// (units are numbered as in ModelLayout: 0 the root, last_block the last).
bool ReshardsAfterForward(const baton::v1::ParallelPlan& plan, int unit, int last_block);

// Bytes of one element of the compute / all-gather dtype.
int ParamBytes(const baton::v1::JobSpec& job);

}  // namespace baton

#endif  // BATON_STRATEGIES_PLANNER_H_
