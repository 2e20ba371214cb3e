#include "strategies/planner.h"

#include <set>

#include "program/program_check.h"
#include "program/sequence_shards.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"
#include "strategies/channel_check.h"
#include "strategies/job_spec.h"
#include "strategies/pipeline.h"
#include "strategies/step_writer.h"
#include "strategies/tensor_parallel.h"

namespace baton {
namespace {

using baton::v1::JobSpec;
using baton::v1::Program;

// The layout of every parameter of the units this rank owns, on every mesh
// axis: where its master, gradient and AdamW pieces live (storage) and what
// the forward uses (compute). `shard_order`: the axes in the order their
// shards apply (tensor parallelism's first).
void DescribeUnits(const ModelLayout& model, const std::set<int>& owned, const DataParallelLayout& layout,
                   const TensorParallelPlan& tp, const DeviceMesh& mesh,
                   const std::vector<std::string>& shard_order, Program* p) {
  for (size_t u = 0; u < model.units.size(); ++u) {
    if (!owned.count(static_cast<int>(u))) continue;
    auto* unit = p->add_units();
    unit->set_index(static_cast<int>(u));
    unit->set_name(model.units[u].name);
    unit->set_resident(layout.resident);
    for (const ParamInfo& info : model.units[u].params) {
      auto* param = unit->add_params();
      param->set_name(info.name);
      for (int64_t d : info.shape) param->add_shape(d);
      *param->mutable_init() = info.init;
      for (const auto& axis : mesh.axes()) {
        Placement storage = Placement::Replicate(), compute = Placement::Replicate();
        if (tp.enabled && axis.name == tp.axis) {
          storage = compute = tp.placement.at(info.name);
        } else if (axis.name == layout.shard_axis) {
          storage = Placement::Shard(0);
        }
        *param->add_placements() = ToWire(storage);
        *param->add_compute_placements() = ToWire(compute);
      }
      for (const auto& axis : shard_order) param->add_shard_order(axis);
      if (tp.grad_partial.count(info.name)) param->add_grad_partial_axes(tp.axis);
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<Program>> CompilePrograms(const JobSpec& job, const std::string& job_id) {
  auto compiled = CompileJob(job, job_id);
  if (!compiled.ok()) return compiled.status();
  return std::move(compiled->programs);
}

absl::StatusOr<CompiledJob> CompileJob(const JobSpec& job, const std::string& job_id) {
  if (auto s = ValidateJobSpec(job); !s.ok()) return s;
  return CompileCheckedJob(job, job_id);
}

absl::StatusOr<CompiledJob> CompileCheckedJob(const JobSpec& job, const std::string& job_id) {
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
    p.set_allow_tf32(job.allow_tf32());
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
    DescribeUnits(model, writer.owned(), layout, *tp, *mesh, shard_order, &p);
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
