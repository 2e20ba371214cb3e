#include "strategies/planner.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/wire.h"
#include "mesh/device_mesh.h"
#include "strategies/job_spec.h"
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

// Writes one rank's step: walks the schedule's passes and inserts around
// them the loads, gathers, frees and reductions the layouts call for,
// keeping track of which units are gathered or in flight so every unit is
// gathered exactly when needed and prefetched one unit ahead.
class StepWriter {
 public:
  StepWriter(const JobSpec& job, const ModelLayout& model, const DataParallelLayout& layout,
             const TensorParallelPlan& tp, const DeviceMesh& mesh, int rank, Program* program)
      : job_(job), model_(model), layout_(layout), tp_(tp), mesh_(mesh), rank_(rank), program_(program) {
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
    if (layout.resident) {
      for (int u = 0; u < n_units; ++u) ready_.insert(u);
    }
    // This rank's place among the data-parallel ranks (row-major over the
    // data axes): which rows of the batch it loads.
    const std::vector<int> coords = *mesh.Coordinates(rank);
    for (int a = 0; a < mesh.ndim(); ++a) {
      if (tp.enabled && mesh.axes()[a].name == tp.axis) continue;
      dp_rank_ = dp_rank_ * mesh.axes()[a].size + coords[a];
    }
  }

  void Write(const std::vector<Pass>& order) {
    Add(Instruction::ZERO_GRAD);
    std::set<int> loaded;
    std::vector<int> backwards_done(model_.units.size(), 0);
    const int microbatches = job_.data().microbatches();
    for (size_t i = 0; i < order.size(); ++i) {
      const Pass& pass = order[i];
      const int unit = model_.stages[pass.stage].unit();
      if (pass.kind == Pass::kForward && loaded.insert(pass.microbatch).second) LoadBatch(pass.microbatch);
      Prepare(unit, NextUnit(order, i));
      Instruction* run = Add(pass.kind == Pass::kForward ? Instruction::FORWARD : Instruction::BACKWARD);
      run->set_stage(pass.stage);
      run->set_microbatch(pass.microbatch);
      if (unit < 0) continue;
      if (pass.kind == Pass::kForward) {
        if (pass.stage == last_stage_[unit] &&
            ReshardsAfterForward(job_.plan(), model_.units[unit], unit == last_block_)) {
          Free(unit);
        }
      } else if (pass.stage == first_stage_[unit]) {  // the unit's backward is complete
        Free(unit);
        if (++backwards_done[unit] == microbatches) ReduceGrads(unit);
      }
    }
    Instruction* metrics = Add(Instruction::REDUCE_METRICS);
    for (const auto& axis : mesh_.axes()) metrics->add_axes(axis.name);
    // Every rank computes the loss of its rows (the tp ranks of a replica
    // the same one): the mean over all of them is the job's.
    metrics->set_value(mesh_.size());
    if (job_.optimizer().max_grad_norm() > 0) {
      // The norm is summed over the ranks whose gradient pieces make up the
      // whole gradient, each piece once: the shard group (DDP: every rank
      // holds it all); with tensor parallelism the whole mesh, replicated
      // pieces weighted by their copies.
      Instruction* clip = Add(Instruction::CLIP_GRAD_NORM);
      if (tp_.enabled) {
        for (const auto& axis : mesh_.axes()) clip->add_axes(axis.name);
      } else if (!layout_.shard_axis.empty()) {
        clip->add_axes(layout_.shard_axis);
      }
      clip->set_value(job_.optimizer().max_grad_norm());
    }
    Add(Instruction::OPTIMIZER_STEP);
    if (layout_.regather_after_step) {
      for (int u = 0; u < static_cast<int>(model_.units.size()); ++u) {
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
    const int64_t per_rank = job_.data().batch_size() / DataParallelSize(job_);
    const int64_t rows = per_rank / job_.data().microbatches();
    Instruction* i = Add(Instruction::LOAD_BATCH);
    i->set_microbatch(mb);
    i->set_row_offset(dp_rank_ * per_rank + mb * rows);
    i->set_rows(rows);
  }

  // The unit of the nearest pass after `i` in the same run (same kind and
  // microbatch) that uses other parameters, or -1.
  int NextUnit(const std::vector<Pass>& order, size_t i) const {
    const int unit = model_.stages[order[i].stage].unit();
    for (size_t j = i + 1; j < order.size(); ++j) {
      if (order[j].kind != order[i].kind || order[j].microbatch != order[i].microbatch) break;
      const int u = model_.stages[order[j].stage].unit();
      if (u >= 0 && u != unit) return u;
    }
    return -1;
  }

  void Gather(int unit) {
    if (unit < 0 || ready_.count(unit) || in_flight_.count(unit)) return;
    UnitOp(Instruction::GATHER_PARAMS, unit, layout_.shard_axis);
    in_flight_.insert(unit);
  }

  // Makes `unit` usable, issuing the prefetch of `next` before waiting, so
  // both gathers are in flight together whenever the first one is exposed.
  void Prepare(int unit, int next) {
    Gather(unit);
    if (job_.plan().prefetch()) Gather(next);
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

  void ReduceGrads(int unit) {
    if (!layout_.shard_axis.empty()) UnitOp(Instruction::REDUCE_SCATTER_GRADS, unit, layout_.shard_axis);
    if (!layout_.shard_axis.empty() && layout_.free_grads) UnitOp(Instruction::FREE_GRADS, unit);
    bool partial = false;  // sequence parallelism leaves partial sums of replicated weights
    for (const ParamInfo& p : model_.units[unit].params) partial |= tp_.grad_partial.count(p.name) > 0;
    if (partial) UnitOp(Instruction::ALL_REDUCE_GRADS, unit, tp_.axis)->set_reduce(Instruction::SUM);
    if (!layout_.replicate_axis.empty()) UnitOp(Instruction::ALL_REDUCE_GRADS, unit, layout_.replicate_axis);
  }

  const JobSpec& job_;
  const ModelLayout& model_;
  const DataParallelLayout& layout_;
  const TensorParallelPlan& tp_;
  const DeviceMesh& mesh_;
  const int rank_;
  Program* const program_;
  int dp_rank_ = 0;
  std::vector<int> first_stage_, last_stage_;
  int last_block_ = -1;
  std::set<int> ready_, in_flight_;
};

}  // namespace

bool ReshardsAfterForward(const baton::v1::ParallelPlan& plan, const UnitInfo& unit, bool last_block) {
  if (unit.root) return plan.root_reshard_after_forward();
  if (last_block) return plan.reshard_after_forward() && plan.reshard_last_block();
  return plan.reshard_after_forward();
}

absl::StatusOr<std::vector<Program>> CompilePrograms(const JobSpec& job, const std::string& job_id) {
  if (auto s = ValidateJobSpec(job); !s.ok()) return s;
  const ModelLayout model = BuildModelLayout(job.model());
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return mesh.status();
  auto tp = PlanTensorParallel(job, model);
  if (!tp.ok()) return tp.status();
  const DataParallelLayout layout = LayoutFor(job);
  std::vector<int> stages;
  for (int s = 0; s < static_cast<int>(model.stages.size()); ++s) stages.push_back(s);
  const SequentialSchedule schedule;
  const std::vector<Pass> order = schedule.Order(stages, job.data().microbatches());
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
    p.set_reports_loss(true);
    // Tokens count once per data-parallel replica: on its first tp rank.
    p.set_counts_tokens(!tp->enabled || *mesh->LocalRank(tp->axis, rank) == 0);
    for (size_t u = 0; u < model.units.size(); ++u) {
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
    StepWriter(job, model, layout, *tp, *mesh, rank, &p).Write(order);
    programs.push_back(std::move(p));
  }
  return programs;
}

}  // namespace baton
