#include "strategies/dry_run.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "program/program_check.h"
#include "program/wire.h"
#include "strategies/job_spec.h"
#include "models/model.h"
#include "strategies/planner.h"

namespace baton {

namespace {

// PlanJob, keeping the model layout for the presentation.
// `checked`: `job` passed ValidateJobSpec already.
absl::StatusOr<JobPlan> Plan(const baton::v1::JobSpec& job, const std::string& job_id, ModelLayout* model,
                             bool checked = false) {
  auto compiled = checked ? CompileCheckedJob(job, job_id) : CompileJob(job, job_id);
  if (!compiled.ok()) return compiled.status();
  JobPlan plan;
  plan.programs = std::move(compiled->programs);
  // What every worker will check before it runs its Program: a plan that
  // fails here is the planner's bug, refused before any worker is touched.
  for (const auto& p : plan.programs) {
    if (auto s = ValidateProgram(p); !s.ok()) {
      return absl::InternalError(absl::StrCat("planner produced an invalid Program for rank ", p.rank(), ": ",
                                              s.message()));
    }
  }
  auto theory = AnalyzePrograms(plan.programs);
  if (!theory.ok()) return theory.status();
  plan.theory = std::move(*theory);
  for (auto& p : plan.programs) {
    p.set_expected_tensor_bytes(PredictedTensorBytes(plan.theory.ranks[p.rank()].memory));
  }
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return mesh.status();
  plan.pipeline = std::move(compiled->pipeline);
  if (plan.pipeline.enabled) plan.timeline = std::move(compiled->timeline);
  for (int rank = 0; rank < mesh->size(); ++rank) {
    plan.idle_fraction.push_back(
        plan.timeline ? plan.timeline->idle_fraction[*mesh->LocalRank(plan.pipeline.axis, rank)] : 0.0);
    plan.max_idle_fraction = std::max(plan.max_idle_fraction, plan.idle_fraction.back());
  }
  if (model != nullptr) *model = std::move(compiled->model);
  return plan;
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const baton::v1::JobSpec& spec, const std::string& job_id) {
  return Plan(WithDefaults(spec), job_id, nullptr);
}

absl::StatusOr<JobPlan> PlanCheckedJob(const baton::v1::JobSpec& checked, const std::string& job_id) {
  return Plan(checked, job_id, nullptr, /*checked=*/true);
}

absl::StatusOr<DryRun> PlanDryRun(const baton::v1::JobSpec& spec) {
  const baton::v1::JobSpec job = WithDefaults(spec);
  ModelLayout model;
  auto planned = Plan(job, "plan", &model);
  if (!planned.ok()) return planned.status();
  DryRun plan;
  static_cast<JobPlan&>(plan) = std::move(*planned);
  auto mesh = ToDeviceMesh(job.mesh());
  if (!mesh.ok()) return mesh.status();
  for (int c = 0; c < plan.pipeline.chunks(); ++c) {
    std::vector<std::string> units;
    for (int s : plan.pipeline.StagesOf(c)) {
      const int u = model.stages[s].unit();
      units.push_back(u >= 0 ? model.units[u].name : baton::v1::StageKind_Name(model.stages[s].kind()));
    }
    plan.chunks.push_back(absl::StrJoin(units, ", "));
  }
  if (plan.pipeline.enabled) {
    plan.bubble_formula = BubbleFraction(plan.pipeline.size, plan.pipeline.virtual_stages, job.data().microbatches());
  }
  for (int rank = 0; rank < mesh->size(); ++rank) {
    const std::vector<int> coords = *mesh->Coordinates(rank);
    std::vector<std::string> parts;
    for (int a = 0; a < mesh->ndim(); ++a) parts.push_back(absl::StrCat(mesh->axes()[a].name, "=", coords[a]));
    plan.coordinates.push_back(absl::StrJoin(parts, ","));
  }
  return plan;
}

}  // namespace baton
