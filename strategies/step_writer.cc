#include "strategies/step_writer.h"

#include <algorithm>

#include "program/program_check.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using baton::v1::JobSpec;
using baton::v1::ParallelMode;

// Whether `unit` frees its gathered parameters after its last forward stage.
bool ReshardsAfterForward(const baton::v1::ParallelPlan& plan, const UnitInfo& unit, bool last_block) {
  if (unit.root) return plan.root_reshard_after_forward();
  if (last_block) return plan.reshard_after_forward() && plan.reshard_last_block();
  return plan.reshard_after_forward();
}

GradReductions::Options ReductionOptions(const JobSpec& job, const DataParallelLayout& layout,
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

}  // namespace

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

StepWriter::StepWriter(const JobSpec& job, const ModelLayout& model, const DataParallelLayout& layout,
                       const TensorParallelPlan& tp, const PipelinePlan& pp, const DeviceMesh& mesh, int rank,
                       baton::v1::Program* program)
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

bool StepWriter::RunsStage(bool (*is)(baton::v1::StageKind)) const {
  for (int s : owned_stages_) {
    if (is(model_.stages[s].kind())) return true;
  }
  return false;
}

void StepWriter::Write(const std::vector<ChunkPass>& chunks) {
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
  WriteStepEnd();
}

// After the passes and their reductions: the metrics, clipping, the
// optimizer step, and the gathers of updated parameters (ZeRO; resident bf16).
void StepWriter::WriteStepEnd() {
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

Instruction* StepWriter::Add(Instruction::Op op) {
  Instruction* i = program_->add_instructions();
  i->set_op(op);
  return i;
}

Instruction* StepWriter::UnitOp(Instruction::Op op, int unit, const std::string& axis) {
  Instruction* i = Add(op);
  i->set_unit(unit);
  if (!axis.empty()) i->add_axes(axis);
  return i;
}

// This rank's rows of the global batch: data parallelism splits it over
// the data-parallel ranks (the tp ranks of one replica load the same
// rows), then into microbatches.
void StepWriter::LoadBatch(int mb) {
  Instruction* i = Add(Instruction::LOAD_BATCH);
  i->set_microbatch(mb);
  i->set_row_offset(dp_rank_ * rows_per_rank_ + mb * rows_);
  i->set_rows(rows_);
}

// An activation (or its gradient) to or from the rank of `chunk`, along
// the pp axis: a microbatch's (batch, sequence, features) - the sequence
// this rank's share under context parallelism, and its shard of that under
// sequence parallelism - or (batch, features).
void StepWriter::PointToPoint(Instruction::Op op, int stage, int mb, int chunk) {
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
std::vector<int> StepWriter::NextUnits(const std::vector<Pass>& order, size_t i) const {
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

void StepWriter::Gather(int unit) {
  if (unit < 0 || ready_.count(unit) || in_flight_.count(unit)) return;
  UnitOp(Instruction::GATHER_PARAMS, unit, layout_.shard_axis);
  in_flight_.insert(unit);
}

// Makes `unit` usable, issuing the prefetches of `next` before waiting, so
// they are in flight together whenever the first one is exposed.
void StepWriter::Prepare(int unit, const std::vector<int>& next) {
  Gather(unit);
  for (int u : next) Gather(u);
  if (unit < 0 || ready_.count(unit)) return;
  in_flight_.erase(unit);
  UnitOp(Instruction::WAIT_PARAMS, unit);
  ready_.insert(unit);
}

void StepWriter::Free(int unit) {
  if (layout_.resident || !ready_.count(unit)) return;
  UnitOp(Instruction::FREE_PARAMS, unit);
  ready_.erase(unit);
}

}  // namespace baton
