// Pipeline parallelism in the planner: the model's stages cut into chunks
// along the pp axis, the schedule each pp rank runs its chunks' passes in,
// and a timeline of the whole schedule (for the bubble and the dry run).
//
// Chunk c (of p x v) holds consecutive blocks; chunk 0 also the embedding
// (MLP: the input), the last chunk the final norm, head and loss. Chunk c
// lives on pp rank c mod p, so with v > 1 (interleaved) each rank holds v
// non-adjacent chunks. Schedules (per rank r, m microbatches):
//   GPIPE             F(0..m-1), then B(0..m-1)
//   ONE_F_ONE_B       p-r-1 warm-up forwards, then one forward one backward,
//                     then the remaining backwards (at most p live microbatches)
//   INTERLEAVED_1F1B  Megatron's: forwards in groups of p microbatches per
//                     chunk, (p-r-1)*2 + (v-1)*p warm-up forwards, then 1F1B
// Activations go to the next chunk's rank and gradients back, worker to
// worker; the order of sends on every (sender, receiver) pair matches the
// order of receives, and the timeline proves no rank waits forever.
#ifndef BATON_STRATEGIES_PIPELINE_H_
#define BATON_STRATEGIES_PIPELINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "models/model.h"

namespace baton {

// One pass of one stage over one microbatch: what the planner wraps its
// gathers, frees, reductions, sends and receives around.
struct Pass {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Pass& o) const {
    return kind == o.kind && stage == o.stage && microbatch == o.microbatch;
  }
};

struct PipelinePlan {
  bool enabled = false;
  std::string axis;
  int size = 1;            // p
  int virtual_stages = 1;  // v
  baton::v1::PipelineParallel::Schedule schedule = baton::v1::PipelineParallel::GPIPE;
  std::vector<int> stage_chunk;  // model stage -> chunk

  int chunks() const { return size * virtual_stages; }
  int RankOf(int chunk) const { return chunk % size; }
  // The model stages of `chunk`, in order.
  std::vector<int> StagesOf(int chunk) const;
};

// Validates the job's pipeline plan (defaults applied) and cuts the model.
// Disabled when the job has none: one chunk holding every stage.
absl::StatusOr<PipelinePlan> PlanPipeline(const baton::v1::JobSpec& job, const ModelLayout& model);

// One pass of a whole chunk (its stages in order, backward in reverse).
struct ChunkPass {
  Pass::Kind kind = Pass::kForward;
  int chunk = 0;
  int microbatch = 0;
};

// The order pp rank `rank` runs its chunks' passes in. Without a pipeline:
// each microbatch in turn, forward then backward (gradient accumulation).
std::vector<ChunkPass> PipelineOrder(const PipelinePlan& plan, int rank, int microbatches);

// Every rank's schedule laid out in time slots, a forward taking one slot and
// a backward two, sends taking none: each pass starts once its rank is free
// and its input (the previous chunk's forward, the next chunk's backward) is
// done. FAILED_PRECONDITION if some rank would wait forever.
struct PipelineTimeline {
  int slots = 0;                      // the step's length
  std::vector<std::string> grid;      // per rank: "F0", "B3", "." per slot, space-separated
  std::vector<double> idle_fraction;  // per rank: slots idle / slots
  std::vector<int> peak_live;         // per rank: most microbatches between forward and backward
};
absl::StatusOr<PipelineTimeline> SimulatePipeline(const PipelinePlan& plan, int microbatches);

// The textbook bubble: (p - 1) / (v m + p - 1).
double BubbleFraction(int p, int v, int m);

}  // namespace baton

#endif  // BATON_STRATEGIES_PIPELINE_H_
