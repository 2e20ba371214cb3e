#include "strategies/planner.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/program_check.h"
#include "common/sequence_shards.h"
#include "common/wire.h"
#include "mesh/device_mesh.h"
#include "strategies/channel_check.h"
#include "strategies/grad_reductions.h"
#include "strategies/job_spec.h"
#include "strategies/pipeline.h"
#include "strategies/tensor_parallel.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::JobSpec;
using baton::v1::ParallelMode;
using baton::v1::Program;

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

DataParallelLayout LayoutFor(const JobSpec& job) {
  DataParallelLayout l;
  const ParallelMode mode = job.plan().mode();
  const std::vector<std::string> data = DataParallelAxes(job);
  const std::string first = data.empty() ? "" : data[0];
  switch (mode) {
    case baton::v1::HSDP:
      l.shard_axis = data[1];
      l.replicate_axis = first;
      break;
    case baton::v1::DDP:
      l.replicate_axis = first;
      l.resident = true;
      break;
    default:  // FSDP, ZERO1, ZERO2
      l.shard_axis = first;
      l.resident = mode == baton::v1::ZERO1 || mode == baton::v1::ZERO2 || first.empty();
      l.regather_after_step =
          l.resident && (!first.empty() || job.plan().mixed_precision().param_dtype() == baton::v1::BF16);
      l.free_grads = mode != baton::v1::ZERO1;
      break;
  }
  return l;
}

// Whether `unit` frees its gathered parameters after its last forward stage.
bool ReshardsAfterForward(const baton::v1::ParallelPlan& plan, const UnitInfo& unit, bool last_block) {
  if (unit.root) return plan.root_reshard_after_forward();
  if (last_block) return plan.reshard_after_forward() && plan.reshard_last_block();
  return plan.reshard_after_forward();
}

// Writes one rank's step: walks the schedule's passes and inserts around
// them the loads, gathers, frees and reductions the layouts call for,
// keeping track of which units are gathered or in flight so every unit is
// gathered exactly when needed and prefetched plan.prefetch_depth units ahead.
class StepWriter {
 public:
  StepWriter(const JobSpec& job, const ModelLayout& model, const DataParallelLayout& layout,
             const TensorParallelPlan& tp, const PipelinePlan& pp, const DeviceMesh& mesh, int rank,
             Program* program)
      : job_(job),
        model_(model),
        layout_(layout),
        tp_(tp),
        pp_(pp),
        mesh_(mesh),
        rank_(rank),
        program_(program),
        reductions_(ReductionOptions(job, layout, tp), model, tp.grad_partial, program) {
    const int n_units = static_cast<int>(model.units.size());
    first_stage_.assign(n_units, -1);
    last_stage_.assign(n_units, -1);
    for (int s = 0; s < static_cast<int>(model.stages.size()); ++s) {
      const int u = model.stages[s].unit();
      if (u < 0) continue;
      if (first_stage_[u] < 0) first_stage_[u] = s;
      last_stage_[u] = s;
    }
    for (int u = n_units - 1; u >= 0 && last_block_ < 0; --u) {
      if (!model.units[u].root) last_block_ = u;
    }
    pp_rank_ = pp.enabled ? *mesh.LocalRank(pp.axis, rank) : 0;
    for (int s = 0; s < static_cast<int>(model.stages.size()); ++s) {
      if (pp.RankOf(pp.stage_chunk[s]) != pp_rank_) continue;
      owned_stages_.push_back(s);
      if (model.stages[s].unit() >= 0) owned_.insert(model.stages[s].unit());
    }
    if (layout.resident) ready_ = owned_;
    // This rank's place among the data-parallel ranks (row-major over the
    // data axes but the context-parallel one, whose ranks load pieces of
    // the same rows): which rows of the batch it loads.
    for (const std::string& axis : BatchAxes(job)) {
      dp_rank_ = dp_rank_ * *mesh.AxisSize(axis) + *mesh.LocalRank(axis, rank);
    }
    rows_per_rank_ = job.data().batch_size() / BatchParallelSize(job);
    rows_ = rows_per_rank_ / job.data().microbatches();
  }

  const std::set<int>& owned() const { return owned_; }
  int pp_rank() const { return pp_rank_; }
  // Whether a stage this rank runs is of a kind `is` picks (the worker's
  // own rules: ReadsBatch, IsLossStage).
  bool RunsStage(bool (*is)(baton::v1::StageKind)) const {
    for (int s : owned_stages_) {
      if (is(model_.stages[s].kind())) return true;
    }
    return false;
  }

  // `chunks`: the order this rank runs its chunks' passes in; each expands
  // to its stages' passes (backward in reverse), with the activations or
  // gradients received before it and sent after it.
  void Write(const std::vector<ChunkPass>& chunks) {
    std::vector<Pass> order;
    std::vector<int> pass_chunk;  // index into `chunks`
    for (size_t c = 0; c < chunks.size(); ++c) {
      std::vector<int> stages = pp_.StagesOf(chunks[c].chunk);
      if (chunks[c].kind == Pass::kBackward) std::reverse(stages.begin(), stages.end());
      for (int s : stages) {
        order.push_back({chunks[c].kind, s, chunks[c].microbatch});
        pass_chunk.push_back(static_cast<int>(c));
      }
    }
    const int last_chunk = pp_.chunks() - 1;
    const bool needs_batch = RunsStage(ReadsBatch);
    Add(Instruction::ZERO_GRAD);
    std::set<int> loaded;
    std::vector<int> backwards_done(model_.units.size(), 0);
    const int microbatches = job_.data().microbatches();
    for (size_t i = 0; i < order.size(); ++i) {
      const Pass& pass = order[i];
      const ChunkPass& chunk = chunks[pass_chunk[i]];
      const bool chunk_starts = i == 0 || pass_chunk[i - 1] != pass_chunk[i];
      const bool chunk_ends = i + 1 == order.size() || pass_chunk[i + 1] != pass_chunk[i];
      const int unit = model_.stages[pass.stage].unit();
      if (pass.kind == Pass::kForward && needs_batch && loaded.insert(pass.microbatch).second) {
        LoadBatch(pass.microbatch);
      }
      if (chunk_starts && pass.kind == Pass::kForward && chunk.chunk > 0) {
        PointToPoint(Instruction::RECV_ACTIVATION, pass.stage, pass.microbatch, chunk.chunk - 1);
      }
      if (chunk_starts && pass.kind == Pass::kBackward && chunk.chunk < last_chunk) {
        PointToPoint(Instruction::RECV_GRAD, pass.stage, pass.microbatch, chunk.chunk + 1);
      }
      Prepare(unit, NextUnits(order, i));
      Instruction* run = Add(pass.kind == Pass::kForward ? Instruction::FORWARD : Instruction::BACKWARD);
      run->set_stage(pass.stage);
      run->set_microbatch(pass.microbatch);
      if (chunk_ends && pass.kind == Pass::kForward && chunk.chunk < last_chunk) {
        PointToPoint(Instruction::SEND_ACTIVATION, pass.stage, pass.microbatch, chunk.chunk + 1);
      }
      if (chunk_ends && pass.kind == Pass::kBackward && chunk.chunk > 0) {
        PointToPoint(Instruction::SEND_GRAD, pass.stage, pass.microbatch, chunk.chunk - 1);
      }
      if (unit < 0) continue;
      if (pass.kind == Pass::kForward) {
        if (pass.stage == last_stage_[unit] &&
            ReshardsAfterForward(job_.plan(), model_.units[unit], unit == last_block_)) {
          Free(unit);
        }
      } else if (pass.stage == first_stage_[unit]) {  // the unit's backward is complete
        Free(unit);
        if (++backwards_done[unit] == microbatches) reductions_.UnitDone(unit);
      }
    }
    reductions_.Finish();
    Instruction* metrics = Add(Instruction::REDUCE_METRICS);
    for (const auto& axis : mesh_.axes()) metrics->add_axes(axis.name);
    // The ranks of the last stage compute the loss of their rows (the tp
    // ranks of a replica the same one): the mean over them is the job's.
    metrics->set_value(mesh_.size() / pp_.size);
    if (job_.optimizer().max_grad_norm() > 0) {
      // The norm is summed over the ranks whose gradient pieces make up the
      // whole gradient, each piece once: the shard group (DDP: every rank
      // holds it all); with tensor parallelism the whole mesh, replicated
      // pieces weighted by their copies.
      Instruction* clip = Add(Instruction::CLIP_GRAD_NORM);
      if (tp_.enabled || pp_.enabled) {
        for (const auto& axis : mesh_.axes()) clip->add_axes(axis.name);
      } else if (!layout_.shard_axis.empty()) {
        clip->add_axes(layout_.shard_axis);
      }
      clip->set_value(job_.optimizer().max_grad_norm());
    }
    Add(Instruction::OPTIMIZER_STEP);
    if (layout_.regather_after_step) {
      for (int u : owned_) {
        UnitOp(Instruction::GATHER_PARAMS, u, layout_.shard_axis);
        UnitOp(Instruction::WAIT_PARAMS, u);
      }
    }
  }

 private:
  Instruction* Add(Instruction::Op op) {
    Instruction* i = program_->add_instructions();
    i->set_op(op);
    return i;
  }

  Instruction* UnitOp(Instruction::Op op, int unit, const std::string& axis = "") {
    Instruction* i = Add(op);
    i->set_unit(unit);
    if (!axis.empty()) i->add_axes(axis);
    return i;
  }

  // This rank's rows of the global batch: data parallelism splits it over
  // the data-parallel ranks (the tp ranks of one replica load the same
  // rows), then into microbatches.
  void LoadBatch(int mb) {
    Instruction* i = Add(Instruction::LOAD_BATCH);
    i->set_microbatch(mb);
    i->set_row_offset(dp_rank_ * rows_per_rank_ + mb * rows_);
    i->set_rows(rows_);
  }

  // An activation (or its gradient) to or from the rank of `chunk`, along
  // the pp axis: a microbatch's (batch, sequence, features) - the sequence
  // this rank's share under context parallelism, and its shard of that under
  // sequence parallelism - or (batch, features).
  void PointToPoint(Instruction::Op op, int stage, int mb, int chunk) {
    std::vector<int> coords = *mesh_.Coordinates(rank_);
    coords[*mesh_.AxisIndex(pp_.axis)] = pp_.RankOf(chunk);
    Instruction* i = Add(op);
    i->set_stage(stage);
    i->set_microbatch(mb);
    i->add_axes(pp_.axis);
    i->set_peer(*mesh_.RankAt(coords));
    i->add_shape(rows_);
    if (job_.model().has_decoder()) {
      const auto& m = job_.model().decoder();
      i->add_shape(m.seq_len() / ContextParallelSize(job_) / (tp_.enabled && tp_.sequence_parallel ? tp_.size : 1));
      i->add_shape(m.dim());
    } else {
      i->add_shape(job_.model().mlp().d_model());
    }
  }

  // The units of the nearest passes after `i` in the same run (same kind
  // and microbatch) that use other parameters, at most plan.prefetch_depth.
  std::vector<int> NextUnits(const std::vector<Pass>& order, size_t i) const {
    std::vector<int> next;
    const size_t depth = static_cast<size_t>(job_.plan().prefetch_depth());
    const int unit = model_.stages[order[i].stage].unit();
    for (size_t j = i + 1; j < order.size() && next.size() < depth; ++j) {
      if (order[j].kind != order[i].kind || order[j].microbatch != order[i].microbatch) break;
      const int u = model_.stages[order[j].stage].unit();
      if (u >= 0 && u != unit && std::find(next.begin(), next.end(), u) == next.end()) next.push_back(u);
    }
    return next;
  }

  void Gather(int unit) {
    if (unit < 0 || ready_.count(unit) || in_flight_.count(unit)) return;
    UnitOp(Instruction::GATHER_PARAMS, unit, layout_.shard_axis);
    in_flight_.insert(unit);
  }

  // Makes `unit` usable, issuing the prefetches of `next` before waiting, so
  // they are in flight together whenever the first one is exposed.
  void Prepare(int unit, const std::vector<int>& next) {
    Gather(unit);
    for (int u : next) Gather(u);
    if (unit < 0 || ready_.count(unit)) return;
    in_flight_.erase(unit);
    UnitOp(Instruction::WAIT_PARAMS, unit);
    ready_.insert(unit);
  }

  void Free(int unit) {
    if (layout_.resident || !ready_.count(unit)) return;
    UnitOp(Instruction::FREE_PARAMS, unit);
    ready_.erase(unit);
  }

  static GradReductions::Options ReductionOptions(const JobSpec& job, const DataParallelLayout& layout,
                                                  const TensorParallelPlan& tp) {
    GradReductions::Options o;
    o.shard_axis = layout.shard_axis;
    o.free_grads = layout.free_grads;
    // Sequence parallelism leaves partial sums of replicated weights.
    if (tp.enabled) o.partial_axis = tp.axis;
    o.replicate_axis = layout.replicate_axis;
    o.bucket_bytes = job.plan().bucket_bytes();
    o.overlap = job.plan().overlap_grad_reduce();
    return o;
  }

  const JobSpec& job_;
  const ModelLayout& model_;
  const DataParallelLayout& layout_;
  const TensorParallelPlan& tp_;
  const PipelinePlan& pp_;
  const DeviceMesh& mesh_;
  const int rank_;
  Program* const program_;
  int dp_rank_ = 0;
  int64_t rows_per_rank_ = 0, rows_ = 0;  // of the global batch; of a microbatch
  int pp_rank_ = 0;
  std::vector<int> owned_stages_;  // the stages of this rank's chunks
  std::set<int> owned_;  // their units
  std::vector<int> first_stage_, last_stage_;
  int last_block_ = -1;
  std::set<int> ready_, in_flight_;
  GradReductions reductions_;
};

}  // namespace

absl::StatusOr<std::vector<Program>> CompilePrograms(const JobSpec& job, const std::string& job_id) {
  auto compiled = CompileJob(job, job_id);
  if (!compiled.ok()) return compiled.status();
  return std::move(compiled->programs);
}

absl::StatusOr<CompiledJob> CompileJob(const JobSpec& job, const std::string& job_id) {
  if (auto s = ValidateJobSpec(job); !s.ok()) return s;
  CompiledJob compiled;
  compiled.model = BuildModelLayout(job.model());
  MarkRecomputedBlocks(job.plan().activation_checkpointing(), &compiled.model);
  const ModelLayout& model = compiled.model;
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return mesh.status();
  auto tp = PlanTensorParallel(job, model);
  if (!tp.ok()) return tp.status();
  auto pp = PlanPipeline(job, model);
  if (!pp.ok()) return pp.status();
  auto timeline = SimulatePipeline(*pp, job.data().microbatches());  // refuses a schedule that deadlocks
  if (!timeline.ok()) return timeline.status();
  const DataParallelLayout layout = LayoutFor(job);
  // With tensor parallelism every shard applies to the tp piece first.
  std::vector<std::string> shard_order;
  if (tp->enabled) {
    shard_order.push_back(tp->axis);
    for (const auto& a : mesh->axes()) {
      if (a.name != tp->axis) shard_order.push_back(a.name);
    }
  }

  std::vector<Program> programs;
  for (int rank = 0; rank < mesh->size(); ++rank) {
    Program p;
    p.set_job_id(job_id);
    p.set_rank(rank);
    *p.mutable_mesh() = job.mesh();
    *p.mutable_model() = job.model();
    *p.mutable_optimizer() = job.optimizer();
    *p.mutable_data() = job.data();
    p.set_seed(job.seed());
    p.set_compute_dtype(job.plan().mixed_precision().param_dtype() == baton::v1::BF16 ? baton::v1::BF16
                                                                                       : baton::v1::FP32);
    p.set_threads(job.threads_per_rank());
    p.set_microbatches(job.data().microbatches());
    StepWriter writer(job, model, layout, *tp, *pp, *mesh, rank, &p);
    // The loss comes from the loss stage; tokens count once per
    // data-parallel replica: on the first stage's first tp rank (each
    // context-parallel rank counts its share of the rows' positions).
    p.set_reports_loss(writer.RunsStage(IsLossStage));
    p.set_counts_tokens(writer.pp_rank() == 0 && (!tp->enabled || *mesh->LocalRank(tp->axis, rank) == 0));
    if (pp->enabled) p.add_stage_axes(pp->axis);
    if (job.plan().has_context_parallel()) {
      *p.mutable_context_parallel() = HeadTailLayout(job.plan().context_parallel().axis(), ContextParallelSize(job));
    }
    for (size_t u = 0; u < model.units.size(); ++u) {
      if (!writer.owned().count(static_cast<int>(u))) continue;
      auto* unit = p.add_units();
      unit->set_index(static_cast<int>(u));
      unit->set_name(model.units[u].name);
      unit->set_resident(layout.resident);
      for (const ParamInfo& info : model.units[u].params) {
        auto* param = unit->add_params();
        param->set_name(info.name);
        for (int64_t d : info.shape) param->add_shape(d);
        *param->mutable_init() = info.init;
        for (const auto& axis : mesh->axes()) {
          Placement storage = Placement::Replicate(), compute = Placement::Replicate();
          if (tp->enabled && axis.name == tp->axis) {
            storage = compute = tp->placement.at(info.name);
          } else if (axis.name == layout.shard_axis) {
            storage = Placement::Shard(0);
          }
          *param->add_placements() = ToWire(storage);
          *param->add_compute_placements() = ToWire(compute);
        }
        for (const auto& axis : shard_order) param->add_shard_order(axis);
        if (tp->grad_partial.count(info.name)) param->add_grad_partial_axes(tp->axis);
      }
    }
    for (auto s : model.stages) {
      if (tp->enabled) {
        auto* par = s.mutable_tensor_parallel();
        par->set_axis(tp->axis);
        par->set_sequence_parallel(tp->sequence_parallel);
        par->set_loss_parallel(tp->loss_parallel);
      }
      *p.add_stages() = s;
    }
    writer.Write(PipelineOrder(*pp, writer.pp_rank(), job.data().microbatches()));
    programs.push_back(std::move(p));
  }
  if (auto s = CheckChannels(programs); !s.ok()) return s;
  compiled.programs = std::move(programs);
  compiled.pipeline = std::move(*pp);
  compiled.timeline = std::move(*timeline);
  return compiled;
}

}  // namespace baton
