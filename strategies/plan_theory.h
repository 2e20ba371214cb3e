// What a plan predicts per rank and step, read off the Programs it compiled,
// so measured figures can be checked exactly, not just roughly:
//   comm_bytes   every collective and send an instruction issues, priced with
//                mesh/collective_cost.h on the pieces its layouts give (the
//                padding of uneven shards included, as the communicators
//                count it);
//   state_bytes  what a rank holds between steps: fp32 master pieces (unless
//                a view of resident parameters), AdamW moments, gradient
//                pieces (unless they are the compute gradients themselves),
//                resident compute parameters, compute gradients no
//                FREE_GRADS releases;
//   peak_unsharded_param_bytes  the most compute-parameter bytes allocated at
//                once, replaying WAIT_PARAMS / FREE_PARAMS;
//   peak_live_microbatches  the most microbatches forwarded but not yet
//                backward on a rank (pipeline schedules hold up to p or m);
//   peak_live_activation_bytes  the most bytes of stage outputs held for
//                backward at once (a block's [rows, seq (/ tp with sequence
//                parallelism), dim] in the compute dtype, a loss stage's
//                fp32 scalar; what autograd saves inside a stage is not
//                counted);
//   memory_bytes the most a rank's process grows by while it holds and runs
//                the job: the state, plus at the worst point of a step the
//                gathered parameters, stage outputs and what autograd saves
//                inside each stage (its footprint in the model definition,
//                models/model.h), compute gradients not yet released, gathers in
//                flight and the instruction's temporaries, plus a fixed
//                kWorkerOverheadBytes (threads, communicator and BLAS
//                buffers). CreateJob refuses a job whose figure exceeds a
//                worker's memory; tests/memory_test checks it against
//                measured peak RSS growth. Activation checkpointing: a
//                recomputed block saves nothing from its forward and holds
//                its graph again during its backward;
//   forward_flops, recompute_flops  the step's forward matmul FLOPs, and
//                those activation checkpointing runs again in backward
//                (each stage's footprint in models/model.h).
// Figures are the maximum over ranks, as the controller reports them.
#ifndef BATON_STRATEGIES_PLAN_THEORY_H_
#define BATON_STRATEGIES_PLAN_THEORY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"

namespace baton {

// One rank's figures.
struct RankTheory {
  int64_t comm = 0;
  double ideal = 0;
  int64_t state = 0;
  int64_t peak = 0;      // unsharded parameter bytes
  int peak_live = 0;     // microbatches between forward and backward
  int64_t peak_live_bytes = 0;  // stage outputs held for backward
  int64_t memory = 0;           // peak process growth (memory_bytes)
  int64_t forward_flops = 0;    // the step's forwards (forward_flops)
  int64_t recompute_flops = 0;  // the recomputed forwards (recompute_flops)
  // Its gloo groups' shared-memory segments where their ranks share a host
  // (mesh/collective_cost.h: SharedSegmentBytes of each group's largest
  // operation input; groups of one rank have none): host memory beside
  // `memory`, which the process's own growth does not show.
  int64_t shared_memory = 0;
  // By instruction (the Program's order): what each sends, `comm` in all
  // (what a trace's spans are checked against: controller/trace_json.h).
  std::vector<int64_t> instruction_comm;
};

// What a worker process grows by for any job besides its tensors (measured:
// a tiny decoder's job grows a worker by ~15 MiB).
inline constexpr int64_t kWorkerOverheadBytes = 16 << 20;
// The tensors alone of a predicted peak growth of `memory_bytes`: what a
// worker's tensor allocator should hold at most (Program.expected_tensor_bytes).
inline int64_t PredictedTensorBytes(int64_t memory_bytes) {
  return memory_bytes > kWorkerOverheadBytes ? memory_bytes - kWorkerOverheadBytes : 0;
}

struct PlanTheory {
  int64_t parameters = 0;  // P
  int64_t comm_bytes = 0;
  // The same traffic without padding: the textbook P (n-1)/n formulas.
  double ideal_comm_bytes = 0;
  int64_t state_bytes = 0;
  int64_t peak_unsharded_param_bytes = 0;
  int peak_live_microbatches = 0;
  int64_t peak_live_activation_bytes = 0;
  int64_t memory_bytes = 0;
  int64_t forward_flops = 0;
  int64_t recompute_flops = 0;
  int64_t shared_memory_bytes = 0;  // the most of any rank (RankTheory::shared_memory)
  std::vector<RankTheory> ranks;  // by rank
};

// `programs`: one per rank of a job, valid (program/program_check.h).
absl::StatusOr<PlanTheory> AnalyzePrograms(const std::vector<baton::v1::Program>& programs);
// Compiles `job` (valid, defaults applied) and analyzes its Programs.
absl::StatusOr<PlanTheory> ComputeTheory(const baton::v1::JobSpec& job);

}  // namespace baton

#endif  // BATON_STRATEGIES_PLAN_THEORY_H_
