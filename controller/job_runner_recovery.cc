// JobRunner's supervision: a failed placement goes RECOVERING; a shrunk job
// grows back; a rescale moves the job onto another mesh. Each leaves its
// state on its workers (LiveState) for the next placement to read worker to
// worker (controller/live_restore.h), a checkpoint being the fallback.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/job_runner.h"
#include "controller/live_restore.h"
#include "controller/step_metrics.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"
#include "strategies/job_spec.h"

namespace baton {

LiveState JobRunner::CurrentLiveState() const {
  LiveState live;
  live.plan = job_->plan();
  live.mesh = mesh_;
  live.step = job_->step();
  live.logged_step = live.step;
  return live;
}

absl::StatusOr<std::optional<baton::v1::CheckpointInfo>> JobRunner::RestoreLive(const std::optional<LiveState>& live,
                                                                                const baton::v1::Mesh& mesh,
                                                                                std::string* why_not) {
  if (!live.has_value()) return std::nullopt;
  // Not behind the checkpoint it would load otherwise (one published after
  // the record a restarted controller read was written is newer than that
  // record's step, but the workers may be as far).
  const int disk_step = restore_.info.path().empty() || !restore_.optimizer ? 0 : restore_.metadata.step();
  LiveState wanted = *live;
  wanted.step = std::max(live->step, disk_step);
  std::vector<CallResult<baton::v1::RunStepResponse>> figures;
  auto plan = PlanLiveRestore(*context_.meshes, job_->id(), wanted, mesh, job_->plan()->programs, &figures);
  if (!plan.ok()) {
    // Said by the restore from disk that follows (JOB_RESTORED).
    *why_not = std::string(plan.status().message());
    return std::nullopt;
  }
  auto loaded = checkpoints_.Load(*plan, mesh);
  if (!loaded.ok()) {
    // Its ranks are half-loaded: placed again, it loads from disk.
    return absl::UnavailableError(absl::StrCat("restoring from live workers failed: ", loaded.status().message()));
  }
  loaded->set_steps_redone(std::max(0, live->logged_step - loaded->step()));
  loaded->set_steps_recovered(RecordKeptFigures(figures, live->logged_step, loaded->step()));
  return *loaded;
}

int JobRunner::RecordKeptFigures(const std::vector<CallResult<baton::v1::RunStepResponse>>& figures, int logged,
                                 int step) {
  // The steps a cut-off call ran that the controller never recorded: from
  // the ranks that kept every one of them (a dead rank's figures are stood
  // for by the others', as for a failed call's completed steps). The
  // controller did not time them: their step_ms is 0.
  const int n = step - logged;
  if (n <= 0) return 0;
  std::vector<CallResult<baton::v1::RunStepResponse>> complete;
  for (const auto& f : figures) {
    const auto& m = f.response.metrics();
    if (m.size() == n && m[0].step() == logged + 1 && m[n - 1].step() == step) complete.push_back(f);
  }
  if (complete.empty()) return 0;
  for (int i = 0; i < n; ++i) {
    int64_t comm_bytes = 0;  // all ranks together
    for (const auto& r : complete) comm_bytes += r.response.metrics(i).comm_bytes();
    job_->RecordStep(AggregateStep(complete, i, 0), comm_bytes);
  }
  return n;
}

void JobRunner::Fail(const std::string& cause) {
  if (!job_->NoteFailure(cause)) {
    return End(baton::v1::JOB_FAILED, job_->restarts_allowed() == 0
                                          ? cause
                                          : absl::StrCat("it failed past its restarts: ", job_->FailureHistory()));
  }
  // RECOVERING: its mesh is gone; it goes back to the head of the queue and
  // waits for the workers it ran on (a dead one's replacement registers
  // under its name), then for any, and resumes from what its live workers
  // keep when they hold all of it, else from its newest checkpoint.
  const baton::v1::RestartPolicy& policy = job_->spec().restart();
  const absl::Duration wait = absl::Milliseconds(policy.has_replacement_timeout_ms() ? policy.replacement_timeout_ms()
                                                                                     : kReplacementTimeoutMs);
  std::vector<std::string> names(mesh_.worker_names().begin(), mesh_.worker_names().end());
  const std::string workers = absl::StrJoin(names, ", ");
  // A worker whose process is gone is dead now: the job need not wait for a
  // heartbeat timeout to learn it must wait for its replacement.
  context_.meshes->DeclareGone(mesh_);
  job_->SetLive(CurrentLiveState());
  job_->SetRecoveryWorkers(std::move(names), absl::Now() + wait);
  FreeWorkers(absl::StrCat("job ", job_->id(), " JOB_RECOVERING"));
  const baton::v1::JobStatus status = job_->status();
  context_.events->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job_->id(), status.step(),
                                   absl::StrCat("restart ", status.restarts(), " of ", job_->restarts_allowed(),
                                                ": waits for [", workers, "] up to ", absl::FormatDuration(wait),
                                                ", then any free workers; resumes from the state its live workers keep, else from its newest checkpoint"),
                                   cause));
  context_.persist(*job_);
  context_.on_end(*job_);
}

bool JobRunner::GrowBack() {
  const int own = MeshSize(*job_->own_spec()), placed = MeshSize(*job_->placed_spec());
  if (static_cast<int>(context_.meshes->FreeWorkers().size()) < own - placed) return false;
  const std::string detail = absl::StrCat("grows back onto its ", own, " workers (from ", placed, ") at step ",
                                          job_->step());
  job_->SetLive(CurrentLiveState());
  job_->Unshrink();
  Move(detail);
  return true;
}

bool JobRunner::Rescale() {
  baton::v1::JobSpec own;
  std::shared_ptr<const JobPlan> plan;
  if (!job_->TakeRescale(&own, &plan)) return false;
  const std::string detail =
      absl::StrCat("rescales from ", FormatMeshSpec(ToMeshAxes(job_->placed_spec()->mesh())), " to ",
                   FormatMeshSpec(ToMeshAxes(own.mesh())), " at step ", job_->step());
  job_->SetLive(CurrentLiveState());
  job_->Rescale(std::move(own), std::move(plan));
  job_->SetRecoveryWorkers({}, absl::InfinitePast());
  Move(detail);
  return true;
}

void JobRunner::Move(const std::string& detail) {
  FreeWorkers(absl::StrCat("job ", job_->id(), " ", detail));
  job_->Enter(baton::v1::JOB_RECOVERING, detail);
  context_.events->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job_->id(), job_->step(), detail, ""));
  context_.persist(*job_);
  context_.on_end(*job_);
}

}  // namespace baton
