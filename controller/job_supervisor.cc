// JobSupervisor: the loop of one job's life and what follows each of its
// runners' outcomes. What a recovery restores and shrinking are in
// job_supervisor_recovery.cc.
#include "controller/job_supervisor.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "controller/job_fit.h"
#include "mesh/device_mesh.h"
#include "program/wire.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

// A placement that failed for the fleet's sake (a worker died or did not
// answer while the mesh formed) is worth another try; a bad request is not.
bool Retriable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kAborted ||
         s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kCancelled;
}

}  // namespace

JobSupervisor::JobSupervisor(std::shared_ptr<Job> job, RestorePlan restore, SupervisorContext context)
    : job_(std::move(job)), context_(std::move(context)), restore_(std::move(restore)) {}

JobSupervisor::~JobSupervisor() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void JobSupervisor::ResumeOn(LiveState live, absl::Time until) {
  absl::MutexLock lock(&mu_);
  own_workers_.assign(live.mesh.worker_names().begin(), live.mesh.worker_names().end());
  own_workers_until_ = until;
  live_ = std::move(live);
}

void JobSupervisor::Start() {
  {
    absl::MutexLock lock(&mu_);
    done_ = false;
  }
  thread_ = std::thread([this] {
    // Named apart from gRPC's pool it was started from (perf, top).
    pthread_setname_np(pthread_self(), "baton-job");
    Loop();
    absl::MutexLock lock(&mu_);
    done_ = true;
  });
}

JobSupervisor::Wants JobSupervisor::wants(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  Wants w;
  if (now < own_workers_until_) w.own_workers = own_workers_;
  w.not_before = not_before_;
  w.shrinking = shrinking_ || shrink_asked_;
  for (const auto& [worker, until] : avoid_) {
    if (now < until) w.avoid.insert(worker);
  }
  return w;
}

int JobSupervisor::FreeForIt() const {
  const std::set<std::string> avoided = wants(absl::Now()).avoid;
  int free = 0;
  const baton::v1::DeviceKind kind = JobDeviceKind(job_->spec());
  for (const auto& w : context_.runner.meshes->FreeWorkers()) {
    free += avoided.count(w.name()) == 0 && WorkerDeviceKind(w) == kind;
  }
  return free;
}

void JobSupervisor::Place(std::vector<baton::v1::WorkerInfo> reserved, bool fits) {
  absl::MutexLock lock(&mu_);
  reserved_ = std::move(reserved);
  fits_ = fits;
}

void JobSupervisor::AskShrink() {
  absl::MutexLock lock(&mu_);
  if (!shrinking_) shrink_asked_ = true;
}

void JobSupervisor::Stop(const std::string& cause) {
  job_->RequestStop(cause);
  absl::MutexLock lock(&mu_);
  if (!stop_) stop_cause_ = cause;
  stop_ = true;
}

void JobSupervisor::Shutdown() {
  job_->RequestShutdown();
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

std::shared_ptr<JobRunner> JobSupervisor::runner() const {
  absl::MutexLock lock(&mu_);
  return runner_;
}

bool JobSupervisor::holds_workers() const {
  absl::MutexLock lock(&mu_);
  return reserved_.has_value() || runner_ != nullptr;
}

bool JobSupervisor::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

JobSupervisor::Turn JobSupervisor::AwaitTurn(std::vector<baton::v1::WorkerInfo>* reserved, bool* fits) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || stop_ || reserved_.has_value() || shrink_asked_;
  };
  mu_.Await(absl::Condition(&ready));
  const bool placed = reserved_.has_value();
  if (placed) {
    *reserved = std::move(*reserved_);
    *fits = fits_;
    reserved_.reset();
  }
  if (shutdown_) return Turn::kShutdown;
  if (stop_) return Turn::kStop;
  if (placed) return Turn::kPlace;
  shrink_asked_ = false;
  shrinking_ = true;
  return Turn::kShrink;
}

void JobSupervisor::Loop() {
  const std::string& id = job_->id();
  while (true) {
    std::vector<baton::v1::WorkerInfo> reserved;
    bool fits = false;
    switch (AwaitTurn(&reserved, &fits)) {
      case Turn::kShutdown:
        if (!reserved.empty()) context_.runner.meshes->Release(id, "the controller is shutting down");
        return;
      case Turn::kStop: {
        std::string cause;
        {
          absl::MutexLock lock(&mu_);
          cause = stop_cause_;
        }
        EndUnplaced(baton::v1::JOB_STOPPED, cause, reserved);
        context_.done(id);
        return;
      }
      case Turn::kShrink: {
        const bool shrunk = Shrink().ok();
        {
          absl::MutexLock lock(&mu_);
          shrinking_ = false;
        }
        // Still first in line: placed now if what is free allows. A job that
        // cannot shrink is asked again at the next schedule.
        if (shrunk) context_.requeue(id);
        continue;
      }
      case Turn::kPlace:
        if (RunOn(reserved, fits)) {
          context_.requeue(id);
          continue;
        }
        if (!job_->ended()) return;  // the controller shuts down: left as it is
        job_->ReleasePrograms();     // of no more use
        context_.done(id);
        return;
    }
  }
}

bool JobSupervisor::RunOn(const std::vector<baton::v1::WorkerInfo>& reserved, bool fits) {
  const bool was_recovering = job_->state() == baton::v1::JOB_RECOVERING;
  const std::shared_ptr<const JobPlacement> placement = job_->placement();
  // Whether it fits is checked once per placement, on the workers it got.
  if (!fits) {
    if (auto s = CheckFits(*placement->spec, placement->plan->theory, reserved, context_.runner.meshes->Workers());
        !s.ok()) {
      EndUnplaced(baton::v1::JOB_FAILED, std::string(s.message()), reserved);
      return false;
    }
  }
  RestorePlan restore;
  std::optional<LiveState> live;
  {
    absl::MutexLock lock(&mu_);
    restore = restore_;
    live = std::move(live_);
    live_.reset();
  }
  RunnerContext context = context_.runner;
  context.published = [this](const std::string& path) {
    absl::MutexLock lock(&mu_);
    unloadable_.erase(path);  // a save published there again: loadable once more
  };
  context.free_workers = [this] { return FreeForIt(); };
  auto runner = std::make_shared<JobRunner>(job_, std::move(restore), live, std::move(context));
  {
    absl::MutexLock lock(&mu_);
    runner_ = runner;
  }
  const RunOutcome outcome = runner->Run();
  if (outcome.kind == RunOutcome::Kind::kPlaceFailed) {
    // Not restored: what its workers kept is still theirs for the next try.
    absl::MutexLock lock(&mu_);
    if (!live_.has_value()) live_ = std::move(live);
  }
  const bool again = TakeUp(*runner, outcome, was_recovering);
  absl::MutexLock lock(&mu_);
  runner_ = nullptr;
  return again;
}

bool JobSupervisor::TakeUp(JobRunner& runner, const RunOutcome& outcome, bool was_recovering) {
  switch (outcome.kind) {
    case RunOutcome::Kind::kEnded:
    case RunOutcome::Kind::kShutdown:
      return false;
    case RunOutcome::Kind::kPlaceFailed:
      return PlacingFailed(runner, outcome.status, was_recovering);
    case RunOutcome::Kind::kFailed:
      return Failed(runner, outcome.cause);
    case RunOutcome::Kind::kGrowBack: {
      const std::shared_ptr<const JobPlacement> placement = job_->placement();
      return Move(runner, placement->Unshrunk(),
                  absl::StrCat("grows back onto its ", MeshSize(*placement->own), " workers (from ",
                               MeshSize(*placement->spec), ") at step ", job_->step()));
    }
    case RunOutcome::Kind::kEvict:
      return Evict(runner, outcome.cause);
    case RunOutcome::Kind::kRescale: {
      baton::v1::JobSpec own;
      std::shared_ptr<const JobPlan> plan;
      if (!job_->TakeRescale(&own, &plan)) return Failed(runner, "a rescale was asked and then gone");
      const std::string detail =
          absl::StrCat("rescales from ", FormatMeshSpec(ToMeshAxes(job_->placement()->spec->mesh())), " to ",
                       FormatMeshSpec(ToMeshAxes(own.mesh())), " at step ", job_->step());
      {
        absl::MutexLock lock(&mu_);
        own_workers_.clear();  // any workers will do for its new mesh
        own_workers_until_ = absl::InfinitePast();
      }
      return Move(runner, JobPlacement::Own(std::move(own), std::move(plan)), detail);
    }
  }
  return false;
}

bool JobSupervisor::PlacingFailed(JobRunner& runner, const absl::Status& status, bool was_recovering) {
  RestorePlan restore;
  {
    absl::MutexLock lock(&mu_);
    restore = restore_;
  }
  if (const std::string path = restore.info.path();
      (status.code() == absl::StatusCode::kNotFound || status.code() == absl::StatusCode::kDataLoss) &&
      restore.optimizer && !restore.info.from_peers() &&
      SavedBy(restore.metadata, job_->id(), JobFingerprint(job_->spec()))) {
    // One of its own checkpoints is missing a file or holds damaged bytes:
    // restored again from the next older one (PlanRecovery), not failed.
    {
      absl::MutexLock lock(&mu_);
      unloadable_[path] = std::string(status.message());
    }
    runner.Conclude(baton::v1::JOB_RECOVERING,
                    absl::StrCat("its checkpoint ", path, " cannot be loaded, so it resumes from an older one: ",
                                 status.message()));
    return Requeue(RestartBackoff());
  }
  if (job_->detached() && Retriable(status)) {
    // Back in line; a restart goes on RECOVERING (it may still shrink).
    if (was_recovering) context_.runner.meshes->DeclareGone(runner.mesh());
    runner.Conclude(was_recovering ? baton::v1::JOB_RECOVERING : baton::v1::JOB_PENDING,
                    absl::StrCat("placing it failed, trying again: ", status.message()));
    return Requeue(was_recovering ? RestartBackoff() : context_.retry_backoff);
  }
  runner.Conclude(baton::v1::JOB_FAILED, std::string(status.message()));
  return false;
}

bool JobSupervisor::Failed(JobRunner& runner, const std::string& cause) {
  if (!job_->NoteFailure(cause)) {
    runner.Conclude(baton::v1::JOB_FAILED, job_->restarts_allowed() == 0
                                               ? cause
                                               : absl::StrCat("it failed past its restarts: ", job_->FailureHistory()));
    return false;
  }
  // RECOVERING: its mesh is gone; it goes back to the head of the queue and
  // waits for the workers it ran on (a dead one's replacement registers
  // under its name), then for any, and resumes from what its live workers
  // keep when they hold all of it, else from its newest checkpoint.
  const baton::v1::RestartPolicy& policy = job_->spec().restart();
  const absl::Duration wait = absl::Milliseconds(policy.has_replacement_timeout_ms() ? policy.replacement_timeout_ms()
                                                                                     : kReplacementTimeoutMs);
  const baton::v1::Mesh& mesh = runner.mesh();
  std::vector<std::string> names(mesh.worker_names().begin(), mesh.worker_names().end());
  const std::string workers = absl::StrJoin(names, ", ");
  // A worker whose process is gone is dead now: the job need not wait for a
  // heartbeat timeout to learn it must wait for its replacement.
  context_.runner.meshes->DeclareGone(mesh);
  {
    absl::MutexLock lock(&mu_);
    live_ = runner.LiveLeft();
    own_workers_ = std::move(names);
    own_workers_until_ = absl::Now() + wait;
  }
  runner.Leave(absl::StrCat("job ", job_->id(), " JOB_RECOVERING"));
  const baton::v1::JobStatus status = job_->status();
  context_.runner.events->Append(JobEvent(
      baton::v1::Event::JOB_RECOVERING, job_->id(), status.step(),
      absl::StrCat("restart ", status.restarts(), " of ", job_->restarts_allowed(), ": waits for [", workers,
                   "] up to ", absl::FormatDuration(wait),
                   ", then any free workers; resumes from the state its live workers keep, else from its newest "
                   "checkpoint"),
      cause));
  context_.runner.persist(*job_);
  return Requeue(RestartBackoff());
}

bool JobSupervisor::Evict(JobRunner& runner, const std::string& worker) {
  const baton::v1::StragglerPolicy& policy = job_->spec().straggler();
  const absl::Duration keep_off = absl::Milliseconds(policy.evict_ms() > 0 ? policy.evict_ms() : kEvictMs);
  {
    absl::MutexLock lock(&mu_);
    avoid_[worker] = absl::Now() + keep_off;
    own_workers_.clear();  // any others will do
    own_workers_until_ = absl::InfinitePast();
  }
  return Move(runner, job_->placement(),
              absl::StrCat("moves off worker ", worker, ", named slow, at step ", job_->step(), "; keeps off it for ",
                           absl::FormatDuration(keep_off)));
}

bool JobSupervisor::Move(JobRunner& runner, std::shared_ptr<const JobPlacement> to, const std::string& detail) {
  {
    absl::MutexLock lock(&mu_);
    live_ = runner.LiveLeft();  // on the mesh it leaves, with that mesh's Programs
  }
  job_->Place(std::move(to));
  runner.Leave(absl::StrCat("job ", job_->id(), " ", detail));
  job_->Enter(baton::v1::JOB_RECOVERING, detail);
  context_.runner.events->Append(JobEvent(baton::v1::Event::JOB_RECOVERING, job_->id(), job_->step(), detail, ""));
  context_.runner.persist(*job_);
  return Requeue(RestartBackoff());
}

bool JobSupervisor::Requeue(absl::Duration pause) {
  if (job_->state() == baton::v1::JOB_RECOVERING) {
    // Planned here, on its own thread: it reads checkpoints.
    auto restore = PlanRecovery(*job_->placement());
    if (!restore.ok()) {
      const std::string cause = absl::StrCat("cannot restore it after its failure: ", restore.status().message());
      job_->Enter(baton::v1::JOB_FAILED, cause);
      context_.runner.events->Append(JobEvent(baton::v1::Event::JOB_FAILED, job_->id(), job_->step(), "", cause));
      context_.runner.persist(*job_);
      return false;
    }
    // What it logged past the checkpoint it resumes from is redone, however
    // many placements that takes (a failed one consumed its live state).
    const int step = job_->step();
    absl::MutexLock lock(&mu_);
    restore->logged_step = std::max({restore->logged_step, restore_.logged_step, step});
    restore_ = std::move(*restore);
  }
  absl::MutexLock lock(&mu_);
  not_before_ = absl::Now() + pause;
  return true;
}

void JobSupervisor::EndUnplaced(baton::v1::JobState state, const std::string& cause,
                                const std::vector<baton::v1::WorkerInfo>& held) {
  if (!held.empty()) {
    context_.runner.meshes->Release(job_->id(), state == baton::v1::JOB_FAILED ? "does not fit" : "stopped");
  }
  if (!job_->Enter(state, cause)) return;
  job_->ReleasePrograms();
  context_.runner.events->Append(JobEvent(
      state == baton::v1::JOB_STOPPED ? baton::v1::Event::JOB_STOPPED : baton::v1::Event::JOB_FAILED, job_->id(),
      job_->step(), "", cause));
  context_.runner.persist(*job_);
}

absl::Duration JobSupervisor::RestartBackoff() const {
  const baton::v1::RestartPolicy& policy = job_->spec().restart();
  return absl::Milliseconds(policy.has_backoff_ms() ? policy.backoff_ms() : kRestartBackoffMs);
}

}  // namespace baton
