// One rank's step, as the planner writes it (strategies/planner.h): the
// passes of the rank's pipeline order with, around them, the batch loads,
// the gathers (prefetched plan.prefetch_depth units ahead) and frees of
// sharded parameters, the activation sends and receives between chunks, the
// gradient reductions (strategies/grad_reductions.h), and the step's end:
// REDUCE_METRICS, CLIP_GRAD_NORM, OPTIMIZER_STEP and any gathers after it.
// Pure planning: no sockets, no tensors, no files.
#ifndef BATON_STRATEGIES_STEP_WRITER_H_
#define BATON_STRATEGIES_STEP_WRITER_H_

#include <set>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "models/model.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "strategies/grad_reductions.h"
#include "strategies/pipeline.h"
#include "strategies/tensor_parallel.h"

namespace baton {

// How the data-parallel mode treats every unit, on the mesh axes tensor
// parallelism leaves (DataParallelAxes).
struct DataParallelLayout {
  std::string shard_axis;      // gathers and reduce-scatters run along it ("" for DDP)
  std::string replicate_axis;  // gradients are all-reduced along it ("" for FSDP, ZeRO)
  bool resident = false;       // compute parameters persist (ZeRO, DDP, nothing sharded)
  bool free_grads = true;      // compute gradients dropped once reduced (not ZeRO-1)
  // Updated parameters gathered after the step (ZeRO), or cast into the
  // resident bf16 compute copies when nothing is sharded.
  bool regather_after_step = false;
};

DataParallelLayout LayoutFor(const baton::v1::JobSpec& job);

// Writes one rank's step into its Program: walks the schedule's passes and
// inserts around them the loads, gathers, frees and reductions the layouts
// call for, keeping track of which units are gathered or in flight so every
// unit is gathered exactly when needed and prefetched plan.prefetch_depth
// units ahead. Everything passed in must outlive the writer.
class StepWriter {
 public:
  StepWriter(const baton::v1::JobSpec& job, const ModelLayout& model, const DataParallelLayout& layout,
             const TensorParallelPlan& tp, const PipelinePlan& pp, const DeviceMesh& mesh, int rank,
             baton::v1::Program* program);

  // The units of the stages this rank runs.
  const std::set<int>& owned() const { return owned_; }
  int pp_rank() const { return pp_rank_; }
  // Whether a stage this rank runs is of a kind `is` picks (the worker's
  // own rules: ReadsBatch, IsLossStage).
  bool RunsStage(bool (*is)(baton::v1::StageKind)) const;

  // `chunks`: the order this rank runs its chunks' passes in; each expands
  // to its stages' passes (backward in reverse), with the activations or
  // gradients received before it and sent after it.
  void Write(const std::vector<ChunkPass>& chunks);

 private:
  baton::v1::Instruction* Add(baton::v1::Instruction::Op op);
  baton::v1::Instruction* UnitOp(baton::v1::Instruction::Op op, int unit, const std::string& axis = "");
  void LoadBatch(int mb);
  void PointToPoint(baton::v1::Instruction::Op op, int stage, int mb, int chunk);
  std::vector<int> NextUnits(const std::vector<Pass>& order, size_t i) const;
  void Gather(int unit);
  void Prepare(int unit, const std::vector<int>& next);
  void Free(int unit);
  void WriteStepEnd();

  const baton::v1::JobSpec& job_;
  const ModelLayout& model_;
  const DataParallelLayout& layout_;
  const TensorParallelPlan& tp_;
  const PipelinePlan& pp_;
  const DeviceMesh& mesh_;
  const int rank_;
  baton::v1::Program* const program_;
  int dp_rank_ = 0;
  int64_t rows_per_rank_ = 0, rows_ = 0;  // of the global batch; of a microbatch
  int pp_rank_ = 0;
  std::vector<int> owned_stages_;  // the stages of this rank's chunks
  std::set<int> owned_;            // their units
  std::vector<int> first_stage_, last_stage_;
  int last_block_ = -1;
  std::set<int> ready_, in_flight_;
  GradReductions reductions_;
};

}  // namespace baton

#endif  // BATON_STRATEGIES_STEP_WRITER_H_
