#include "controller/job_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/controller_metrics.h"
#include "controller/live_restore.h"
#include "common/wire.h"
#include "controller/step_metrics.h"
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

JobRunner::JobRunner(std::shared_ptr<Job> job, RestorePlan restore, RunnerContext context)
    : job_(std::move(job)),
      restore_(std::move(restore)),
      context_(std::move(context)),
      checkpoints_(job_.get(), context_.meshes, context_.events, context_.checkpoints) {}

JobRunner::~JobRunner() {
  if (thread_.joinable()) thread_.join();
}

void JobRunner::Start() {
  thread_ = std::thread([this] {
    Run();
    finished_ = true;
  });
}

absl::Status JobRunner::Place() {
  const baton::v1::JobSpec& spec = job_->spec();
  const std::shared_ptr<const baton::v1::JobSpec> placed = job_->placed_spec();  // shrunk, or its own
  auto mesh = context_.meshes->Form(job_->id(), {placed->mesh().begin(), placed->mesh().end()}, job_->status().backend());
  if (!mesh.ok()) return mesh.status();
  {
    absl::MutexLock lock(&job_->work_mu());
    mesh_ = *mesh;
  }
  job_->SetMesh(*mesh);
  job_->ClearMeshLost();  // a restart: the old mesh's loss is behind it
  // A worker that died between the rendezvous and now: its abort named a
  // mesh the job did not know yet.
  if (!context_.meshes->Intact(*mesh)) {
    return absl::UnavailableError(absl::StrCat(mesh->mesh_id(), " was aborted while job ", job_->id(), " was placed"));
  }
  std::string abort_reason;
  FanOut fan_out;
  fan_out.deadline = kLoadDeadline + context_.meshes->options().rpc_slack;
  fan_out.should_abort = [&] { return context_.meshes->DeadWorkerIn(*mesh); };
  const std::shared_ptr<const JobPlan> plan = job_->plan();
  const auto& programs = plan->programs;
  auto results = context_.meshes->dispatcher()->Call<LoadProgramRpc>(
      MeshManager::Targets(*mesh),
      [&](size_t r) {
        baton::v1::LoadProgramRequest req;
        req.set_epoch(mesh->epoch());
        *req.mutable_program() = programs[r];
        if (restore_.data_seed != spec.seed()) req.mutable_program()->set_data_seed(restore_.data_seed);
        return req;
      },
      fan_out, &abort_reason);
  if (const std::string why = context_.meshes->AbortOnFailure(*mesh, results, abort_reason); !why.empty()) {
    return absl::UnavailableError(absl::StrCat("loading job ", job_->id(), " failed: ", why));
  }
  int step = 0;
  baton::v1::CheckpointInfo restored;
  // From what its last mesh left on live workers when they keep all of it
  // (no disk), else from its checkpoint.
  std::optional<LiveState> live = job_->TakeLive();
  std::string not_live;
  if (auto from_peers = RestoreLive(live, *mesh, &not_live); !from_peers.ok()) {
    return from_peers.status();
  } else if (from_peers->has_value()) {
    restored = **from_peers;
    step = restored.step();
  } else if (!restore_.info.path().empty()) {
    // A rank that fails to read drops the job; it never runs half-loaded.
    auto loaded = checkpoints_.Load(restore_, *mesh, not_live);
    if (!loaded.ok()) return loaded.status();
    restored = *loaded;
    step = restore_.optimizer ? restore_.metadata.step() : 0;
  }
  if (live.has_value()) ReleaseLiveState(*context_.meshes, job_->id(), live->mesh);
  job_->SetStart(step, restore_.data_seed, restored);
  context_.meshes->SetState(*mesh, baton::v1::RUNNING);
  return absl::OkStatus();
}

void JobRunner::Run() {
  const bool recovering = job_->state() == baton::v1::JOB_RECOVERING;
  if (absl::Status placed = Place(); !placed.ok()) {
    std::string why;
    const Job::Interrupt interrupt = job_->interrupt(&why);
    if (interrupt == Job::Interrupt::kShutdown) return End(baton::v1::JOB_PENDING, "");
    if (interrupt == Job::Interrupt::kStop) return End(baton::v1::JOB_STOPPED, why);
    if (job_->detached() && Retriable(placed)) {
      // Back in line; a restart goes on RECOVERING (it may still shrink).
      if (recovering) context_.meshes->DeclareGone(mesh_);
      return End(recovering ? baton::v1::JOB_RECOVERING : baton::v1::JOB_PENDING,
                 absl::StrCat("placing it failed, trying again: ", placed.message()));
    }
    return End(baton::v1::JOB_FAILED, std::string(placed.message()));
  }
  job_->Enter(baton::v1::JOB_RUNNING);
  context_.events->Append(JobEvent(baton::v1::Event::JOB_STARTED, job_->id(), job_->step(),
                                   absl::StrCat("on ", mesh_.mesh_id(), " [",
                                                absl::StrJoin(mesh_.worker_names().begin(), mesh_.worker_names().end(), ", "),
                                                "]")));
  context_.persist(*job_);
  if (job_->detached()) job_->RequestSteps(job_->steps());
  const int max_failures = job_->spec().checkpoint().max_failures();
  while (job_->step() < job_->steps()) {
    std::string why;
    const Job::Interrupt interrupt = job_->AwaitWork(absl::Seconds(1));
    job_->interrupt(&why);
    if (interrupt == Job::Interrupt::kShutdown) return End(baton::v1::JOB_PENDING, "");
    if (interrupt == Job::Interrupt::kStop) return End(baton::v1::JOB_STOPPED, why);
    if (interrupt == Job::Interrupt::kMeshLost) return Fail(why);
    if (Rescale()) return;
    if (!job_->HasWork()) continue;  // nothing asked yet
    absl::Status ran;
    bool saved = false;
    {
      absl::MutexLock work(&job_->work_mu());
      const int step = job_->step() + 1;
      const int k = StepsForCall(step);
      job_->SetStepsRunning(k);
      ran = RunSteps(step, k);
      job_->SetStepsRunning(0);
      const baton::v1::CheckpointSpec& ck = job_->spec().checkpoint();
      if (ran.ok() && ck.every_n_steps() > 0 && (step + k - 1) % ck.every_n_steps() == 0) {
        checkpoints_.Save(mesh_, ck.dir(), ck.async(), /*periodic=*/true).IgnoreError();  // recorded in the job
        saved = true;
      }
    }
    if (!ran.ok()) {
      const Job::Interrupt now = job_->interrupt(&why);
      if (now == Job::Interrupt::kStop) return End(baton::v1::JOB_STOPPED, why);
      if (now == Job::Interrupt::kShutdown) return End(baton::v1::JOB_PENDING, "");
      return Fail(std::string(ran.message()));
    }
    // A save (or its failure) is on disk before the step is settled; steps
    // alone are written by the manager's next tick.
    saved ? context_.persist(*job_) : context_.persist_progress(*job_);
    const baton::v1::JobStatus status = job_->status();
    if (status.checkpoint_failures() < max_failures) job_->SettleStep(status.step());
    if (status.checkpoint_failures() >= max_failures) {
      return End(baton::v1::JOB_FAILED, absl::StrCat(status.checkpoint_failures(), " checkpoint saves failed in a row "
                                                     "(checkpoint.max_failures ", max_failures, "); the last: ",
                                                     status.checkpoint_error()));
    }
    if (job_->shrunk() && job_->step() < job_->steps() && GrowBack()) return;
  }
  if (job_->detached()) return End(baton::v1::JOB_FINISHED, "");
  // An attached job that ran its last step is FINISHED, and keeps its
  // workers (its state) while its client holds it: the client may still
  // save it. They are freed when the client stops it or its lease lapses.
  if (!Conclude(baton::v1::JOB_FINISHED, "")) return context_.on_end(*job_);
  while (job_->AwaitWork(absl::Seconds(1)) == Job::Interrupt::kNone) {
  }
  Release(absl::StrCat("job ", job_->id(), " JOB_FINISHED, released by its client"), /*ended=*/true);
}

int JobRunner::StepsForCall(int step) const {
  int k = job_->steps_per_call();
  if (job_->detached() || k == 0) {
    // A second's worth at the last call's pace (one step first, to learn it).
    k = last_step_ms_ <= 0 ? 1
                           : static_cast<int>(std::min<double>(kMaxStepsPerRunStep,
                                                               absl::ToDoubleMilliseconds(kPacedCallTarget) /
                                                                   last_step_ms_));
  }
  k = std::min(k, job_->target_step() - step + 1);
  // A periodic checkpoint's step ends the call, so the save follows it.
  if (const int every = job_->spec().checkpoint().every_n_steps(); every > 0) {
    k = std::min(k, (step + every - 1) / every * every - step + 1);
  }
  return std::clamp(k, 1, kMaxStepsPerRunStep);
}

absl::Status JobRunner::RunSteps(int first, int k) {
  const baton::v1::Mesh& mesh = mesh_;
  const int step = first;
  const int64_t timeout_ms = job_->collective_timeout_ms();
  baton::v1::RunStepRequest rr;
  rr.set_epoch(mesh.epoch());
  rr.set_job_id(job_->id());
  rr.set_step(first);
  rr.set_steps(k);
  rr.set_timeout_ms(timeout_ms);
  std::string abort_reason, why;
  std::vector<size_t> dead;
  const absl::Time started = absl::Now();
  // When one rank fails, the mesh is aborted on every worker at once (a
  // rank blocked on a dead stage's neighbour returns instead of waiting for
  // its timeout), and every rank's own outcome is collected.
  const Drain drain{[&](const std::vector<grpc::Status>& so_far, const std::string& reason) {
                      why = context_.meshes->AbortWith(mesh, so_far, reason);
                      dead = context_.meshes->DeadRanksIn(mesh);  // a stopped worker never answers
                      return dead;
                    },
                    kStepDrain};
  FanOut fan_out;
  fan_out.deadline = std::max(kMinStepDeadline, absl::Milliseconds(timeout_ms) * kStepDeadlineInTimeouts) * k +
                     context_.meshes->options().rpc_slack;
  fan_out.should_abort = [&]() -> std::string {
    std::string cause;
    if (job_->interrupt(&cause) != Job::Interrupt::kNone) return absl::StrCat("job ", job_->id(), ": ", cause);
    return context_.meshes->DeadWorkerIn(mesh);
  };
  fan_out.drain = &drain;
  auto results = context_.meshes->dispatcher()->Call<RunStepRpc>(MeshManager::Targets(mesh), [&](size_t) { return rr; },
                                                               fan_out, &abort_reason);
  if (!why.empty()) {
    std::string ranks;
    for (size_t r = 0; r < results.size(); ++r) {
      const grpc::Status& s = results[r].status;
      const std::string label = WorkerLabel(mesh, static_cast<int>(r));
      const double seconds = absl::ToDoubleSeconds(results[r].elapsed);
      if (s.ok()) {
        absl::StrAppendFormat(&ranks, "\n  %s finished the step after %.2f s", label, seconds);
      } else if (std::find(dead.begin(), dead.end(), r) != dead.end()) {
        absl::StrAppendFormat(&ranks, "\n  %s is DEAD: not waited for", label);
      } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
        absl::StrAppendFormat(&ranks, "\n  %s was still running %s after the abort; cancelled", label,
                              absl::FormatDuration(kStepDrain));
      } else {
        absl::StrAppendFormat(&ranks, "\n  %s returned after %.2f s: %s", label, seconds, s.error_message());
      }
    }
    // The steps of the call before the failed one completed on every rank
    // that said so (a failed rank's answer carries what it completed; a
    // dead one's nothing: the others' stand for it): they are counted.
    const int completed = RecordCompleted(results, k);
    return absl::UnavailableError(
        absl::StrCat("job ", job_->id(), " step ", first + completed, " failed: ", why, ranks));
  }
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].response.metrics_size() != k) {
      return absl::InternalError(absl::StrCat("job ", job_->id(), " steps ", first, "-", first + k - 1, ": ",
                                              WorkerLabel(mesh, static_cast<int>(r)), " answered ",
                                              results[r].response.metrics_size(), " of ", k, " steps"));
    }
  }
  last_step_ms_ = absl::ToDoubleMilliseconds(absl::Now() - started) / k;
  Record(results, k, last_step_ms_);
  return absl::OkStatus();
}

void JobRunner::Record(const std::vector<CallResult<baton::v1::RunStepResponse>>& results, int k, double step_ms) {
  for (int i = 0; i < k; ++i) {
    const baton::v1::StepMetrics m = AggregateStep(results, i, step_ms);
    int64_t comm_bytes = 0;  // all ranks together
    for (const auto& r : results) comm_bytes += r.response.metrics(i).comm_bytes();
    job_->RecordStep(m, comm_bytes);
    if (context_.metrics != nullptr) context_.metrics->ObserveStep(job_->status(), m, comm_bytes);
  }
}

int JobRunner::RecordCompleted(const std::vector<CallResult<baton::v1::RunStepResponse>>& results, int k) {
  std::vector<CallResult<baton::v1::RunStepResponse>> answered;
  int completed = k;
  for (const auto& r : results) {
    CallResult<baton::v1::RunStepResponse> a;
    if (r.status.ok()) {
      a.response = r.response;
    } else if (!a.response.ParseFromString(r.status.error_details()) || a.response.failed_step() == 0) {
      continue;  // dead, cancelled, an old worker: says nothing
    }
    completed = std::min(completed, a.response.metrics_size());
    answered.push_back(std::move(a));
  }
  if (answered.empty()) return 0;
  Record(answered, completed, last_step_ms_);
  return completed;
}

absl::StatusOr<baton::v1::CheckpointInfo> JobRunner::Save(const std::string& dir, bool async) {
  absl::MutexLock work(&job_->work_mu());
  const baton::v1::JobState state = job_->state();
  if ((state != baton::v1::JOB_RUNNING && state != baton::v1::JOB_FINISHED) || !context_.meshes->Intact(mesh_)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_->id(), " is ",
                                                      baton::v1::JobState_Name(job_->state()), ": nothing to save"));
  }
  auto saved = checkpoints_.Save(mesh_, dir, async, /*periodic=*/false);
  context_.persist(*job_);
  return saved;
}

bool JobRunner::Conclude(baton::v1::JobState state, const std::string& cause) {
  // The last async save is published (or fails) while the workers still
  // hold its pieces.
  checkpoints_.AwaitInFlight(CheckpointCoordinator::kSaveDeadline).IgnoreError();
  const baton::v1::JobStatus status = job_->status();
  const int max_failures = job_->spec().checkpoint().max_failures();
  std::string why = cause;
  if (state == baton::v1::JOB_FINISHED && status.checkpoint_failures() >= max_failures) {
    state = baton::v1::JOB_FAILED;
    why = absl::StrCat(status.checkpoint_failures(), " checkpoint saves failed in a row; the last: ",
                       status.checkpoint_error());
  }
  // Ended, the job holds no worker any more (but an attached job that
  // FINISHED: its client may still save it).
  if (state != baton::v1::JOB_FINISHED || job_->detached()) {
    FreeWorkers(absl::StrCat("job ", job_->id(), " ", baton::v1::JobState_Name(state)), IsEnded(state));
  }
  job_->Enter(state, why);
  const baton::v1::Event::Kind kind = state == baton::v1::JOB_FINISHED  ? baton::v1::Event::JOB_FINISHED
                                      : state == baton::v1::JOB_STOPPED ? baton::v1::Event::JOB_STOPPED
                                      : state == baton::v1::JOB_FAILED  ? baton::v1::Event::JOB_FAILED
                                      : state == baton::v1::JOB_RECOVERING ? baton::v1::Event::JOB_RECOVERING
                                                                          : baton::v1::Event::JOB_REQUEUED;
  context_.events->Append(JobEvent(kind, job_->id(), job_->step(),
                                   state == baton::v1::JOB_FINISHED ? absl::StrCat("after ", job_->step(), " steps") : "",
                                   why));
  context_.persist(*job_);
  return state == baton::v1::JOB_FINISHED;
}

void JobRunner::FreeWorkers(const std::string& reason, bool ended) {
  checkpoints_.AwaitInFlight(CheckpointCoordinator::kSaveDeadline).IgnoreError();
  if (ended) {
    context_.meshes->ReleaseEnded(job_->id(), reason);
  } else {
    context_.meshes->Release(job_->id(), reason);
  }
  job_->SetMesh(baton::v1::Mesh());
}

void JobRunner::Release(const std::string& reason, bool ended) {
  FreeWorkers(reason, ended);
  context_.persist(*job_);
  context_.on_end(*job_);
}

void JobRunner::End(baton::v1::JobState state, const std::string& cause) {
  if (state == baton::v1::JOB_PENDING && cause.empty()) {
    // The controller is shutting down: the job stays as it is, for the next
    // controller to take up.
    FreeWorkers("the controller is shutting down");
    context_.persist(*job_);
    return;
  }
  Conclude(state, cause);
  context_.on_end(*job_);
}

}  // namespace baton
