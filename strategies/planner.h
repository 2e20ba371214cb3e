// The planner: FSDP (ZeRO-3), HSDP, ZeRO-1, ZeRO-2 and DDP on the data
// axes, composed with tensor parallelism (strategies/tensor_parallel.h) and
// pipeline parallelism (strategies/pipeline.h), each on its own axis. Turns a
// validated JobSpec into one Program per rank: a layout for every parameter
// of the units the rank owns and the instructions the worker's Executor runs
// each step. Pure planning: no sockets, no tensors, no files.
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
//   PP     nothing on the pp axis: a rank owns only its chunks' units
//
// Around the passes of the rank's pipeline order (without a pipeline: each
// microbatch's forward, then its backward):
//   RECV_ACTIVATION before a chunk's forward and SEND_ACTIVATION after it
//   (RECV_GRAD / SEND_GRAD around its backward), to and from the ranks of the
//   neighbouring chunks; every (sender, receiver) channel is then checked to
//   carry its sends in the order of its receives, shapes equal;
//   gather a unit before its stage runs, prefetching the next unit's; free it
//   after its last forward stage (reshard_after_forward; the embedding, the
//   head and the last block keep theirs by default) and after its backward;
//   after a unit's last backward: REDUCE_SCATTER_GRADS along the shard axis,
//   FREE_GRADS (not ZeRO-1), ALL_REDUCE_GRADS with SUM along tp for weights
//   with partial gradients (sequence parallelism), ALL_REDUCE_GRADS along the
//   replicate axis;
// then REDUCE_METRICS, CLIP_GRAD_NORM (over the shard axis, or the whole mesh
// with tensor or pipeline parallelism), OPTIMIZER_STEP, and (ZeRO; resident
// bf16) gathering every owned unit's updated parameters.
#ifndef BATON_STRATEGIES_PLANNER_H_
#define BATON_STRATEGIES_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "models/model.h"
#include "strategies/pipeline.h"

namespace baton {

// A compiled job: one Program per rank and what they were planned from.
struct CompiledJob {
  std::vector<baton::v1::Program> programs;  // by rank
  ModelLayout model;
  PipelinePlan pipeline;      // .enabled = false without one
  PipelineTimeline timeline;  // by pp rank (one rank without a pipeline)
};

// `job` must have its defaults applied (strategies/job_spec.h); it is
// validated here.
absl::StatusOr<CompiledJob> CompileJob(const baton::v1::JobSpec& job, const std::string& job_id);
// The same for a `job` that has its defaults applied and passed
// ValidateJobSpec already (an admitted job's): not validated again.
absl::StatusOr<CompiledJob> CompileCheckedJob(const baton::v1::JobSpec& job, const std::string& job_id);
// The Programs alone.
absl::StatusOr<std::vector<baton::v1::Program>> CompilePrograms(const baton::v1::JobSpec& job,
                                                                const std::string& job_id);

}  // namespace baton

#endif  // BATON_STRATEGIES_PLANNER_H_
