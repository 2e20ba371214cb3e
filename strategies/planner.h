// The planner: FSDP (ZeRO-3), HSDP, ZeRO-1, ZeRO-2 and DDP on the data
// axes, composed with tensor parallelism on its own axis
// (strategies/tensor_parallel.h). Turns a validated JobSpec into one Program
// per rank: a layout for every parameter and the instructions the worker's
// Executor runs each step. Pure planning: no sockets, no tensors, no files.
//
// Layouts (master / gradient / AdamW pieces | compute tensor, per mesh axis):
//   FSDP   Shard(0) | Replicate on the shard axis
//   HSDP   (Replicate, Shard(0)) | (Replicate, Replicate) on (replicate, shard)
//   ZeRO   as FSDP, with resident units: the full parameters persist and
//          each master is a view of its rows
//   DDP    Replicate | Replicate, resident units
//   TP     the style's placement on the tp axis in both (COLWISE Shard(0),
//          ROWWISE Shard(1)); data-parallel shards are taken from the tp
//          piece (shard order tp first); stages carry the tp axis
//
// Around the passes a Schedule yields (data parallelism: each microbatch's
// forward, then its backward):
//   gather a unit before its stage runs, prefetching the next unit's; free it
//   after its last forward stage (reshard_after_forward; the embedding, the
//   head and the last block keep theirs by default) and after its backward;
//   after a unit's last backward: REDUCE_SCATTER_GRADS along the shard axis,
//   FREE_GRADS (not ZeRO-1), ALL_REDUCE_GRADS with SUM along tp for weights
//   with partial gradients (sequence parallelism), ALL_REDUCE_GRADS along the
//   replicate axis;
// then REDUCE_METRICS, CLIP_GRAD_NORM (over the shard axis, or the whole mesh
// with tensor parallelism), OPTIMIZER_STEP, and (ZeRO; resident bf16)
// gathering every unit's updated parameters.
#ifndef BATON_STRATEGIES_PLANNER_H_
#define BATON_STRATEGIES_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "strategies/model_layout.h"
#include "strategies/schedule.h"

namespace baton {

// `job` must be valid with defaults applied (strategies/job_spec.h).
absl::StatusOr<std::vector<baton::v1::Program>> CompilePrograms(const baton::v1::JobSpec& job,
                                                                const std::string& job_id);

// Whether `unit` frees its gathered parameters after its last forward stage.
bool ReshardsAfterForward(const baton::v1::ParallelPlan& plan, const UnitInfo& unit, bool last_block);

}  // namespace baton

#endif  // BATON_STRATEGIES_PLANNER_H_
