// JobManager's supervision: what a RECOVERING job restores, and shrinking it
// onto the workers left when too few are free (RestartPolicy.min_workers).
#include <optional>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "strategies/job_spec.h"

namespace baton {

absl::StatusOr<RestorePlan> JobManager::PlanRecovery(const Job& job, const baton::v1::JobSpec& placed,
                                                     const JobPlan& plan) {
  std::map<std::string, std::string> unloadable = job.unloadable();
  const std::vector<std::string> points =
      ResumePoints(job.Record(), options_.checkpoints.file_root, unloadable, &unloadable);
  std::optional<RestorePlan> restore;
  std::string skipped;
  absl::Status planned = FromNewest(
      points, unloadable,
      [&](const std::string& point) {
        auto r = PlanRestore(options_.checkpoints.file_root, placed, plan.programs, point);
        if (r.ok()) restore = std::move(*r);
        return r.status();
      },
      &skipped);
  if (!planned.ok()) return planned;
  if (!skipped.empty()) {
    events_->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job.id(), job.step(),
                             absl::StrCat("restores from ", restore->info.path(), ": newer checkpoints cannot be loaded"),
                             skipped));
  }
  return std::move(*restore);
}

absl::StatusOr<RestorePlan> JobManager::Shrink(Job& job) {
  const baton::v1::JobSpec spec = *job.own_spec();
  const int own = MeshSize(spec);
  const int min_workers = spec.restart().has_min_workers() ? spec.restart().min_workers() : own;
  const int free = static_cast<int>(meshes_->FreeWorkers().size());
  if (min_workers >= own || free < min_workers) {
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
    auto plan = PlanJob(placed, job.id());
    if (!plan.ok()) continue;
    auto restore = PlanRecovery(job, placed, *plan);
    if (!restore.ok()) return restore.status();
    const std::string detail = absl::StrCat("shrunk onto ", d * others, " of its ", own, " workers (",
                                            spec.mesh(axis).name(), "=", d, " instead of ", size,
                                            "): too few free after its replacement timeout");
    job.Reshape(std::move(placed), std::make_shared<const JobPlan>(std::move(*plan)));
    events_->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job.id(), job.step(), detail, ""));
    return restore;
  }
  return absl::FailedPreconditionError("no smaller data-parallel size fits the free workers and the batch");
}

absl::StatusOr<baton::v1::JobStatus> JobManager::Rescale(const std::string& id,
                                                        const std::vector<baton::v1::MeshAxis>& mesh,
                                                        const std::string& request_id) {
  auto job = Find(id);
  if (!job.ok()) return job.status();
  // A retry of a request already taken (its answer lost): what became of it.
  if (!request_id.empty() && (*job)->status().rescale().request_id() == request_id) return (*job)->status();
  const baton::v1::JobSpec own = *(*job)->own_spec();
  if (static_cast<int>(mesh.size()) != own.mesh_size()) {
    return absl::InvalidArgumentError(absl::StrCat("job ", id, " has ", own.mesh_size(), " mesh axes; the rescale names ",
                                                   mesh.size()));
  }
  baton::v1::JobSpec rescaled = own;
  for (int a = 0; a < own.mesh_size(); ++a) {
    if (mesh[a].name() != own.mesh(a).name()) {
      return absl::InvalidArgumentError(absl::StrCat("axis ", a, " of job ", id, " is \"", own.mesh(a).name(),
                                                     "\"; the rescale names \"", mesh[a].name(), "\""));
    }
    rescaled.mutable_mesh(a)->set_size(mesh[a].size());
  }
  rescaled.clear_workers();
  if (auto s = ValidateJobSpec(rescaled); !s.ok()) return s;
  auto plan = PlanJob(rescaled, id);
  if (!plan.ok()) return plan.status();
  const int need = MeshSize(rescaled), fleet = static_cast<int>(meshes_->Workers().size());
  if (need > fleet) {
    return absl::ResourceExhaustedError(absl::StrCat("the mesh needs ", need, " workers; the fleet has ", fleet));
  }
  if ((*job)->state() != baton::v1::JOB_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", baton::v1::JobState_Name((*job)->state()),
                                                      "; only a running job is rescaled"));
  }
  if (auto s = (*job)->RequestRescale(std::move(rescaled), std::make_shared<const JobPlan>(std::move(*plan)),
                                      request_id);
      !s.ok()) {
    return s;
  }
  Persist(**job);
  return (*job)->status();
}

}  // namespace baton
