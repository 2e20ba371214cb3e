// JobSupervisor's recovery: what a RECOVERING job restores from disk, and
// shrinking it onto the workers left when too few are free
// (RestartPolicy.min_workers). Both compile or read checkpoints: on the
// supervisor's thread, under no lock.
#include <optional>

#include "absl/strings/str_cat.h"
#include "controller/job_supervisor.h"
#include "controller/resume_points.h"
#include "strategies/job_spec.h"

namespace baton {

absl::StatusOr<RestorePlan> JobSupervisor::PlanRecovery(const JobPlacement& placement) {
  std::map<std::string, std::string> unloadable;
  {
    absl::MutexLock lock(&mu_);
    unloadable = unloadable_;
  }
  const std::string& file_root = context_.runner.checkpoints.file_root;
  const std::vector<std::string> points = ResumePoints(job_->Record(), file_root, unloadable, &unloadable);
  std::optional<RestorePlan> restore;
  std::string skipped;
  absl::Status planned = FromNewest(
      points, unloadable,
      [&](const std::string& point) {
        auto r = PlanRestore(file_root, *placement.spec, placement.plan->programs, point);
        if (r.ok()) restore = std::move(*r);
        return r.status();
      },
      &skipped);
  if (!planned.ok()) return planned;
  if (!skipped.empty()) {
    context_.runner.events->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job_->id(), job_->step(),
                                            absl::StrCat("restores from ", restore->info.path(),
                                                         ": newer checkpoints cannot be loaded"),
                                            skipped));
  }
  return std::move(*restore);
}

absl::Status JobSupervisor::Shrink() {
  const std::shared_ptr<const JobPlacement> placement = job_->placement();
  const baton::v1::JobSpec& spec = *placement->own;
  const int own = MeshSize(spec);
  const int min_workers = spec.restart().has_min_workers() ? spec.restart().min_workers() : own;
  const int free = FreeForIt();  // less the workers it keeps off (evicted as slow)
  if (job_->state() != baton::v1::JOB_RECOVERING || min_workers >= own || free < min_workers) {
    return absl::FailedPreconditionError("it may not shrink, or too few workers are free for its min_workers");
  }
  // The data-parallel axis: the one neither tensor nor pipeline parallelism
  // takes (one only: HSDP's two are not shrunk).
  int axis = -1;
  for (int a = 0; a < spec.mesh_size(); ++a) {
    const std::string& name = spec.mesh(a).name();
    if (name == spec.plan().tensor_parallel().axis() || name == spec.plan().pipeline_parallel().axis()) continue;
    if (axis >= 0) return absl::FailedPreconditionError("more than one data-parallel axis");
    axis = a;
  }
  if (axis < 0) return absl::FailedPreconditionError("no data-parallel axis to shrink");
  const int size = spec.mesh(axis).size(), others = own / size;
  // The largest data-parallel size that fits what is free and keeps the
  // global batch whole.
  for (int d = size - 1; d >= 1; --d) {
    if (d * others > free || d * others < min_workers) continue;
    baton::v1::JobSpec placed = spec;
    placed.mutable_mesh(axis)->set_size(d);
    placed.clear_workers();
    if (!ValidateJobSpec(placed).ok()) continue;  // the batch does not split over d replicas
    auto plan = PlanJob(placed, job_->id());
    if (!plan.ok()) continue;
    std::shared_ptr<const JobPlacement> shrunk =
        placement->Shrunk(std::move(placed), std::make_shared<const JobPlan>(std::move(*plan)));
    auto restore = PlanRecovery(*shrunk);
    if (!restore.ok()) return restore.status();
    const std::string detail = absl::StrCat("shrunk onto ", d * others, " of its ", own, " workers (",
                                            spec.mesh(axis).name(), "=", d, " instead of ", size,
                                            "): too few free after its replacement timeout");
    job_->Place(std::move(shrunk));
    {
      absl::MutexLock lock(&mu_);
      restore_ = std::move(*restore);
    }
    context_.runner.events->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job_->id(), job_->step(), detail, ""));
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError("no smaller data-parallel size fits the free workers and the batch");
}

}  // namespace baton
