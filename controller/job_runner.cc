#include "controller/job_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/controller_metrics.h"
#include "controller/live_restore.h"
#include "program/wire.h"
#include "controller/step_call.h"
#include "strategies/job_spec.h"

namespace baton {

JobRunner::JobRunner(std::shared_ptr<Job> job, RestorePlan restore, std::optional<LiveState> live,
                     RunnerContext context)
    : job_(std::move(job)),
      restore_(std::move(restore)),
      live_(std::move(live)),
      context_(std::move(context)),
      checkpoints_(job_.get(), context_.meshes, context_.events, context_.checkpoints, context_.published) {}

absl::Status JobRunner::Place() {
  const baton::v1::JobSpec& spec = job_->spec();
  const std::shared_ptr<const JobPlacement> placement = job_->placement();  // shrunk, or its own
  const std::shared_ptr<const baton::v1::JobSpec> placed = placement->spec;
  auto mesh = context_.meshes->Form(job_->id(), {placed->mesh().begin(), placed->mesh().end()}, job_->status().backend());
  if (!mesh.ok()) return mesh.status();
  {
    absl::MutexLock lock(&job_->work_mu());
    mesh_ = *mesh;
  }
  job_->SetMesh(*mesh);
  job_->ClearMeshLost();  // a restart: the old mesh's loss is behind it
  // Each placement watches its own mesh from its first step.
  if (spec.has_straggler()) stragglers_.emplace(spec.straggler(), StragglerDetector::PeerGroups(*placed));
  // A worker that died between the rendezvous and now: its abort named a
  // mesh the job did not know yet.
  if (!context_.meshes->Intact(*mesh)) {
    return absl::UnavailableError(absl::StrCat(mesh->mesh_id(), " was aborted while job ", job_->id(), " was placed"));
  }
  std::string abort_reason;
  FanOut fan_out;
  fan_out.deadline = kLoadDeadline + context_.meshes->options().rpc_slack;
  fan_out.should_abort = [&] { return context_.meshes->DeadWorkerIn(*mesh); };
  const auto& programs = placement->plan->programs;
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
  const std::optional<LiveState>& live = live_;
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
    // What its log held past the checkpoint is redone (known from the log
    // even where its workers' state was not found).
    const int logged = std::max(live.has_value() ? live->logged_step : 0, restore_.logged_step);
    restored.set_steps_redone(std::max(0, logged - step));
  }
  if (live.has_value()) ReleaseLiveState(*context_.meshes, job_->id(), live->mesh);
  job_->SetStart(step, restore_.data_seed, restored);
  context_.meshes->SetState(*mesh, baton::v1::RUNNING);
  return absl::OkStatus();
}

RunOutcome JobRunner::Run() {
  if (absl::Status placed = Place(); !placed.ok()) {
    std::string why;
    const Job::Interrupt interrupt = job_->interrupt(&why);
    if (interrupt == Job::Interrupt::kShutdown) return ShutDown();
    if (interrupt == Job::Interrupt::kStop) return End(baton::v1::JOB_STOPPED, why);
    return RunOutcome{RunOutcome::Kind::kPlaceFailed, std::move(placed), ""};
  }
  job_->Enter(baton::v1::JOB_RUNNING);
  context_.events->Append(JobEvent(baton::v1::Event::JOB_STARTED, job_->id(), job_->step(),
                                   absl::StrCat("on ", mesh_.mesh_id(), " [",
                                                absl::StrJoin(mesh_.worker_names().begin(), mesh_.worker_names().end(), ", "),
                                                "]")));
  context_.persist(*job_);
  if (job_->detached()) job_->RequestSteps(job_->steps(), CallSettings{0, context_.collective_timeout_ms});
  const int max_failures = job_->spec().checkpoint().max_failures();
  while (job_->step() < job_->steps()) {
    // One read decides: the interrupt, its cause and whether work is asked.
    const Job::Outlook now = job_->AwaitWork(absl::Seconds(1));
    if (now.interrupt == Job::Interrupt::kShutdown) return ShutDown();
    if (now.interrupt == Job::Interrupt::kStop) return End(baton::v1::JOB_STOPPED, now.why);
    if (now.interrupt == Job::Interrupt::kMeshLost) return RunOutcome{RunOutcome::Kind::kFailed, absl::OkStatus(), now.why};
    if (now.rescale_asked) return RunOutcome{RunOutcome::Kind::kRescale, absl::OkStatus(), ""};
    if (!now.has_work()) continue;  // nothing asked yet
    // A client's save that waits for the work lock goes first (the lock is
    // not fair, and the runner takes it again at once).
    for (int i = 0; i < 100 && saves_waiting_.load() > 0; ++i) absl::SleepFor(absl::Milliseconds(1));
    absl::Status ran;
    {
      absl::MutexLock work(&job_->work_mu());
      ran = RunCalls();
    }
    if (!ran.ok()) {
      std::string why;
      const Job::Interrupt after = job_->interrupt(&why);
      if (after == Job::Interrupt::kStop) return End(baton::v1::JOB_STOPPED, why);
      if (after == Job::Interrupt::kShutdown) return ShutDown();
      return RunOutcome{RunOutcome::Kind::kFailed, absl::OkStatus(), std::string(ran.message())};
    }
    const baton::v1::JobStatus status = job_->status();
    if (status.checkpoint_failures() >= max_failures) {
      return End(baton::v1::JOB_FAILED, absl::StrCat(status.checkpoint_failures(), " checkpoint saves failed in a row "
                                                     "(checkpoint.max_failures ", max_failures, "); the last: ",
                                                     status.checkpoint_error()));
    }
    // A rank named slow, EVICT: the job leaves its worker between steps.
    if (!evict_.empty() && job_->step() < job_->steps()) return RunOutcome{RunOutcome::Kind::kEvict, absl::OkStatus(), evict_};
    // Shrunk, and the workers its own mesh needs are free again: it grows
    // back between steps.
    if (job_->step() < job_->steps() && MayGrowBack()) return RunOutcome{RunOutcome::Kind::kGrowBack, absl::OkStatus(), ""};
  }
  if (job_->detached()) return End(baton::v1::JOB_FINISHED, "");
  // An attached job that ran its last step is FINISHED, and keeps its
  // workers (its state) while its client holds it: the client may still
  // save it. They are freed when the client stops it or its lease lapses.
  if (!Conclude(baton::v1::JOB_FINISHED, "")) return RunOutcome{};
  while (job_->AwaitWork(absl::Seconds(1)).interrupt == Job::Interrupt::kNone) {
  }
  Leave(absl::StrCat("job ", job_->id(), " JOB_FINISHED, released by its client"), /*ended=*/true);
  context_.persist(*job_);
  return RunOutcome{};
}

RunOutcome JobRunner::End(baton::v1::JobState state, const std::string& cause) {
  Conclude(state, cause);
  return RunOutcome{};  // kEnded
}

RunOutcome JobRunner::ShutDown() {
  // The job stays as it is, for the next controller to take up.
  Leave("the controller is shutting down");
  context_.persist(*job_);
  return RunOutcome{RunOutcome::Kind::kShutdown, absl::OkStatus(), ""};
}

int JobRunner::StepsForCall(const Job::Outlook& now, int step, absl::Time starts) const {
  int k = now.call.steps_per_call;
  if (job_->detached() || k == 0) {
    // A second's worth at the last call's pace (one step first, to learn it).
    k = last_step_ms_ <= 0 ? 1
                           : static_cast<int>(std::min<double>(kMaxStepsPerRunStep,
                                                               absl::ToDoubleMilliseconds(kPacedCallTarget) /
                                                                   last_step_ms_));
  }
  k = std::min(k, now.target_step - step + 1);
  // Steps due to start after the asking client stops waiting would be
  // withdrawn then: a call holds what fits before (at least one step).
  if (const absl::Time by = now.call.answer_by; last_step_ms_ > 0 && by != absl::InfiniteFuture()) {
    k = std::min(k, static_cast<int>(std::max(1.0, absl::ToDoubleMilliseconds(by - starts) / last_step_ms_)));
  }
  // A periodic checkpoint's step ends the call, so the save follows it.
  if (const int every = job_->spec().checkpoint().every_n_steps(); every > 0) {
    k = std::min(k, (step + every - 1) / every * every - step + 1);
  }
  return std::clamp(k, 1, kMaxStepsPerRunStep);
}

std::unique_ptr<StepCall> JobRunner::StartCall(int first) {
  const Job::Outlook now = job_->outlook();  // one lock, once: K and the call's settings
  const absl::Time starts = std::max(absl::Now(), wire_free_);
  const int k = StepsForCall(now, first, starts);
  wire_free_ = starts + absl::Milliseconds(k * last_step_ms_);
  job_->AddStepsRunning(k);
  return std::make_unique<StepCall>(StepCall::Context{job_.get(), context_.meshes, context_.metrics}, mesh_, first, k,
                                    now.call.collective_timeout_ms, job_->trace().Wants(first));
}

bool JobRunner::MayRunAhead(const StepCall& call) const {
  const baton::v1::CheckpointSpec& ck = job_->spec().checkpoint();
  const Job::Outlook now = job_->outlook();  // one lock, once
  if (call.last() >= now.target_step) return false;  // nothing more asked yet
  if (wire_free_ >= now.call.answer_by) return false;  // it would start after its client stopped waiting
  // A mesh's first call runs alone: it learns the pace (the next call's K),
  // and the workers know their step before a call waits for its turn.
  if (last_step_ms_ <= 0) return false;
  if (SavesAt(call.last())) return false;  // its save comes first
  if (saves_waiting_.load() > 0) return false;  // so does a client's
  if (!evict_.empty()) return false;  // it leaves a slow worker first
  // Whatever the runner takes up between calls.
  if (now.interrupt != Job::Interrupt::kNone || now.rescale_asked || now.shrunk) return false;
  return now.checkpoint_failures < ck.max_failures();
}

bool JobRunner::MayGrowBack() const {
  const std::shared_ptr<const JobPlacement> placement = job_->placement();
  if (!placement->shrunk()) return false;
  const int free = context_.free_workers ? context_.free_workers()
                                         : static_cast<int>(context_.meshes->FreeWorkers().size());
  return free >= MeshSize(*placement->own) - MeshSize(*placement->spec);
}

void JobRunner::WatchStragglers(const StepCall& call) {
  if (!stragglers_.has_value()) return;
  const baton::v1::StragglerPolicy& policy = job_->spec().straggler();
  for (size_t i = 0; i < call.compute_ms_by_rank().size(); ++i) {
    const int step = call.first() + static_cast<int>(i);
    for (const StragglerDetector::Finding& f : stragglers_->Observe(call.compute_ms_by_rank()[i])) {
      baton::v1::Straggler s;
      s.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
      s.set_step(step);
      s.set_rank(f.rank);
      s.set_worker(f.rank < mesh_.worker_names_size() ? mesh_.worker_names(f.rank) : "");
      s.set_factor(f.factor);
      s.set_evicted(policy.action() == baton::v1::StragglerPolicy::EVICT && evict_.empty());
      if (s.evicted()) evict_ = s.worker();
      const std::string detail = absl::StrFormat(
          "rank %d on %s: its compute %.2fx its peers' median over the last %d steps (threshold %.2f)%s", f.rank,
          s.worker(), f.factor, stragglers_->window(), stragglers_->threshold(),
          s.evicted() ? "; the job moves off it" : "");
      baton::v1::Event e = JobEvent(baton::v1::Event::STRAGGLER, job_->id(), step, detail, "");
      e.set_worker(s.worker());
      e.set_mesh_id(mesh_.mesh_id());
      context_.events->Append(std::move(e));
      job_->RecordStraggler(std::move(s));
    }
  }
}

bool JobRunner::SavesAt(int step) const {
  const int every = job_->spec().checkpoint().every_n_steps();
  return every > 0 && step % every == 0;
}

absl::Status JobRunner::RunCalls() {
  const baton::v1::CheckpointSpec& ck = job_->spec().checkpoint();
  wire_free_ = absl::InfinitePast();  // nothing on the wire
  std::unique_ptr<StepCall> call = StartCall(job_->step() + 1);
  absl::Time previous_end = absl::InfinitePast();
  while (call != nullptr) {
    // The next call goes on the wire before this one is waited for: each
    // worker takes it up the moment this one ends.
    std::unique_ptr<StepCall> next = MayRunAhead(*call) ? StartCall(call->last() + 1) : nullptr;
    if (absl::Status ran = call->Finish(previous_end); !ran.ok()) {
      job_->ClearStepsRunning();
      return ran;  // `next` is cancelled: its mesh is aborted
    }
    last_step_ms_ = call->step_ms();
    previous_end = call->ended();
    WatchStragglers(*call);
    // A periodic checkpoint's step ends a call, and nothing runs ahead of
    // it: the save holds that step's state. It (or its failure) is on disk
    // before the step is settled; steps alone are written by the manager's
    // next tick.
    const bool save = SavesAt(call->last());
    if (save) checkpoints_.Save(mesh_, ck.dir(), ck.async(), /*periodic=*/true).IgnoreError();  // recorded in the job
    save ? context_.persist(*job_) : context_.persist_progress(*job_);
    if (job_->checkpoint_failures() < ck.max_failures()) job_->SettleStep(call->last());
    call = std::move(next);
  }
  return absl::OkStatus();
}

absl::StatusOr<baton::v1::CheckpointInfo> JobRunner::Save(const std::string& dir, bool async) {
  // The runner starts no call ahead while a save waits for the work lock.
  saves_waiting_.fetch_add(1);
  absl::MutexLock work(&job_->work_mu());
  saves_waiting_.fetch_sub(1);
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
    Leave(absl::StrCat("job ", job_->id(), " ", baton::v1::JobState_Name(state)), IsEnded(state));
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

void JobRunner::Leave(const std::string& reason, bool ended) {
  checkpoints_.AwaitInFlight(CheckpointCoordinator::kSaveDeadline).IgnoreError();
  if (ended) {
    context_.meshes->ReleaseEnded(job_->id(), reason);
  } else {
    context_.meshes->Release(job_->id(), reason);
  }
  job_->SetMesh(baton::v1::Mesh());
}

}  // namespace baton
