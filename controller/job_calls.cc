// JobManager: the calls an attached job's client makes (Step, KeepAlive),
// checkpoints on demand (Save, AwaitSave) and a rescale asked of a running
// job (RescaleJob).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "controller/job_manager.h"
#include "mesh/device_mesh.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

// Its client's call, for the lease: held while the call runs.
class CallScope {
 public:
  explicit CallScope(Job& job) : job_(job) { job_.lease().BeginCall(absl::Now()); }
  ~CallScope() { job_.lease().EndCall(absl::Now()); }

 private:
  Job& job_;
};

absl::Status NotRunning(const baton::v1::JobStatus& s) {
  return absl::FailedPreconditionError(absl::StrCat("job ", s.job_id(), " is ", baton::v1::JobState_Name(s.state()),
                                                    s.error().empty() ? "" : ": " + s.error()));
}

constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<JobManager::StepOutcome> JobManager::Step(const std::string& id, int n, int per_call,
                                                         int64_t collective_timeout_ms, absl::Time deadline,
                                                         const std::function<bool()>& cancelled,
                                                         const StepReport& report) {
  auto found = Find(id);
  if (!found.ok()) return found.status();
  Job& job = **found;
  if (job.detached()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is detached: the controller steps it; follow it with `baton logs --follow ", id, "`"));
  }
  CallScope call(job);
  if (job.ended()) return NotRunning(job.status());
  int64_t seen = job.log().last_sequence();
  const int target = job.RequestSteps(n, CallSettings{per_call, collective_timeout_ms, deadline});
  StepOutcome out;
  // What the log gained since `seen`, into `out`.
  auto collect = [&] {
    for (const auto& e : job.log().After(seen)) {
      seen = e.sequence();
      if (e.has_step()) out.metrics.push_back(e.step());
      if (e.has_checkpoint()) out.checkpoints.push_back(e.checkpoint());
      if (e.entry_case() == baton::v1::JobLogEntry::kCheckpointError) out.checkpoint_errors.push_back(e.checkpoint_error());
    }
  };
  bool reached = false, left = false;
  absl::Time next_part = absl::InfinitePast();  // when the next part may go
  while (true) {
    // Reporting as it goes, the call wakes for every step that settles, but
    // sends at most one part per kStepPartInterval: within it, it waits for the
    // last step asked for only, then sends whatever settled meanwhile.
    const absl::Time now = absl::Now();
    const bool hold = report && now < next_part;
    const int awaited = report && !hold ? std::min(target, job.step() + 1) : target;
    const bool settled =
        job.AwaitStep(awaited, std::min({deadline, now + kCancelPoll, hold ? next_part : absl::InfiniteFuture()}));
    reached = job.step() >= target;
    if (report && !reached && (settled || (hold && absl::Now() >= next_part))) {
      collect();
      if (!out.metrics.empty() || !out.checkpoints.empty() || !out.checkpoint_errors.empty()) {
        out.status = job.status();
        left = !report(std::move(out));
        out = StepOutcome();
        next_part = absl::Now() + kStepPartInterval;
      }
    }
    if (reached || left || job.ended() || absl::Now() >= deadline || (cancelled && cancelled())) break;
  }
  const int running = job.step() + 1;  // the first of those running
  if (!reached) job.WithdrawSteps();  // what has not started yet
  collect();
  out.status = job.status();
  if (reached || out.status.state() == baton::v1::JOB_FINISHED) return out;
  // Answered with an error: what settled since the last part (steps, saves
  // and failed saves held for the part interval) goes first, as a part.
  const baton::v1::JobStatus status = out.status;
  if (report && !left && (!out.metrics.empty() || !out.checkpoints.empty() || !out.checkpoint_errors.empty())) {
    left = !report(std::move(out));
  }
  if (status.state() == baton::v1::JOB_FAILED) {
    return absl::UnavailableError(absl::StrCat("job ", id, " FAILED: ", status.error()));
  }
  if (IsEnded(status.state())) return NotRunning(status);
  if (left || (cancelled && cancelled())) {
    return absl::CancelledError(absl::StrCat("the call was cancelled; step ", running, " of job ", id,
                                             " completes on its own and is counted then"));
  }
  return absl::DeadlineExceededError(absl::StrCat("the call's deadline passed at step ", running, " of job ", id,
                                                  "; a step already running completes on its own and is counted then"));
}

std::shared_ptr<JobSupervisor> JobManager::SupervisorOf(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = supervisors_.find(id);
  return it == supervisors_.end() ? nullptr : it->second;
}

std::shared_ptr<JobRunner> JobManager::RunnerOf(const std::string& id) const {
  std::shared_ptr<JobSupervisor> supervisor = SupervisorOf(id);
  return supervisor == nullptr ? nullptr : supervisor->runner();
}

absl::StatusOr<baton::v1::JobStatus> JobManager::KeepAlive(const std::string& id) {
  auto job = Find(id);
  if (!job.ok()) return job.status();
  CallScope call(**job);
  const baton::v1::JobStatus status = (*job)->status();
  if (IsEnded(status.state())) return NotRunning(status);
  return status;
}

absl::StatusOr<baton::v1::CheckpointInfo> JobManager::Save(const std::string& id, const std::string& dir, bool async) {
  auto job = Find(id);
  if (!job.ok()) return job.status();
  CallScope call(**job);
  std::shared_ptr<JobRunner> runner = RunnerOf(id);
  if (runner == nullptr) {
    const baton::v1::JobStatus s = (*job)->status();
    if (s.state() == baton::v1::JOB_FAILED) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " FAILED: its state is not trustworthy to save"));
    }
    return NotRunning(s);
  }
  return runner->Save(dir.empty() ? (*job)->spec().checkpoint().dir() : dir, async);
}

absl::StatusOr<baton::v1::JobStatus> JobManager::AwaitSave(const std::string& id, absl::Duration timeout) {
  auto job = Find(id);
  if (!job.ok()) return job.status();
  CallScope call(**job);
  std::shared_ptr<JobRunner> runner = RunnerOf(id);
  if (runner != nullptr) {
    if (auto s = runner->AwaitSave(timeout); !s.ok()) return s;
  }
  const baton::v1::JobStatus status = (*job)->status();
  if (!status.checkpoint_error().empty()) return absl::UnavailableError(status.checkpoint_error());
  return status;
}

absl::StatusOr<baton::v1::JobStatus> JobManager::Rescale(const std::string& id,
                                                        const std::vector<baton::v1::MeshAxis>& mesh,
                                                        const std::string& request_id) {
  auto job = Find(id);
  if (!job.ok()) return job.status();
  // A retry of a request already taken (its answer lost): what became of it.
  if (!request_id.empty() && (*job)->status().rescale().request_id() == request_id) return (*job)->status();
  const baton::v1::JobSpec own = *(*job)->placement()->own;
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
