// JobManager: the queue and its schedule, stopping, the monitor's tick,
// the job table's writes. Admission is in job_admission.cc, recovery at
// start-up in job_recovery.cc, supervision in job_supervision.cc, and the
// calls an attached job's client makes in job_calls.cc.
#include "controller/job_manager.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "controller/job_fit.h"
#include "strategies/job_spec.h"

namespace baton {

JobManager::JobManager(MeshManager* meshes, EventLog* events, ControllerMetrics* metrics, JobStore* store,
                       JobManagerOptions options)
    : meshes_(meshes), events_(events), metrics_(metrics), store_(store), options_(std::move(options)) {}

JobManager::~JobManager() { Shutdown(); }

void JobManager::StartRunner(const std::shared_ptr<Job>& job, RestorePlan restore) {
  RunnerContext context;
  context.meshes = meshes_;
  context.events = events_;
  context.metrics = metrics_;
  context.checkpoints = options_.checkpoints;
  context.collective_timeout_ms = options_.collective_timeout_ms;
  context.persist = [this](Job& j) { Persist(j); };
  context.persist_progress = [this](Job& j) {
    absl::MutexLock lock(&persist_mu_);
    unwritten_.insert(j.id());
  };
  context.on_end = [this](Job& j) { OnEnd(j); };
  auto runner = std::make_shared<JobRunner>(job, std::move(restore), std::move(context));
  runner->Start();
  runners_[job->id()] = std::move(runner);
}

void JobManager::Schedule() {
  std::shared_ptr<Job> job = SchedulePass(/*may_shrink=*/true);
  if (job == nullptr) return;
  // Compiling the smaller mesh's Programs and planning its restore (which
  // reads checkpoints) run without the table's lock.
  auto restore = Shrink(*job);
  {
    absl::MutexLock lock(&mu_);
    shrinking_.erase(job->id());
    if (!restore.ok()) return;  // it holds the line, as it did
    if (std::find(queue_.begin(), queue_.end(), job->id()) != queue_.end()) restores_[job->id()] = std::move(*restore);
  }
  SchedulePass(/*may_shrink=*/false);
}

std::shared_ptr<Job> JobManager::SchedulePass(bool may_shrink) {
  std::vector<std::pair<std::shared_ptr<Job>, std::pair<baton::v1::JobState, std::string>>> ends;
  std::shared_ptr<Job> to_shrink;
  {
    absl::MutexLock lock(&mu_);
    // First in line, first placed. A job that cannot be placed yet and waits
    // for workers it names (its own after a failure, or its spec's) keeps
    // them, and the jobs behind it that fit on other free workers start
    // meanwhile (backfill): they take nothing it waits for. One that waits
    // for a number of workers holds the line: whatever started behind it
    // would take workers it waits for, and it could wait forever.
    std::set<std::string> kept;  // workers named by waiting jobs ahead
    std::string held_by;         // the job that holds the line, and why
    size_t i = 0;
    while (!shutting_down_ && i < queue_.size()) {
      const std::string id = queue_[i];
      auto it = jobs_.find(id);
      std::shared_ptr<Job> job = it == jobs_.end() ? nullptr : it->second;
      std::string cause;
      if (job == nullptr || job->ended() || job->interrupt(&cause) == Job::Interrupt::kStop) {
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
        restores_.erase(id);
        if (job != nullptr && !job->ended()) ends.push_back({job, {baton::v1::JOB_STOPPED, cause}});
        continue;
      }
      if (auto nb = not_before_.find(id); nb != not_before_.end() && absl::Now() < nb->second) {
        held_by = absl::StrCat(id, ", which waits before it restarts");
        break;
      }
      if (shrinking_.count(id)) {
        held_by = absl::StrCat(id, ", which is being shrunk onto the workers left");
        break;
      }
      // A restart waits for the workers it ran on for a while, then takes
      // what its spec allows - or, too few being free, shrinks if it may.
      std::vector<std::string> names = job->recovery_workers(absl::Now());
      const bool waits_for_its_own = !names.empty();
      if (names.empty()) names.assign(job->spec().workers().begin(), job->spec().workers().end());
      std::string taken;
      for (const std::string& n : names) {
        if (kept.count(n)) taken = n;
      }
      if (!taken.empty()) {
        job->SetWaitingFor(absl::StrCat("worker ", taken.substr(0, 128), ", which a job ahead of it waits for"));
        ++i;
        continue;
      }
      auto reserved = meshes_->Reserve(id, MeshSize(*job->placed_spec()), names, kept);
      if (!reserved.ok() && i == 0 && !waits_for_its_own && job->state() == baton::v1::JOB_RECOVERING && may_shrink) {
        // Shrunk after this pass, outside the lock; it holds the line
        // meanwhile (below: it waits for a number of workers).
        shrinking_.insert(id);
        to_shrink = job;
      }
      if (!reserved.ok()) {
        job->SetWaitingFor(std::string(reserved.status().message()));
        if (names.empty()) {
          held_by = absl::StrCat(id, ", which ", reserved.status().message());
          break;
        }
        kept.insert(names.begin(), names.end());
        ++i;
        continue;
      }
      const baton::v1::JobSpec& spec = *job->placed_spec();
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
      not_before_.erase(id);
      RestorePlan restore = std::move(restores_[id]);
      restores_.erase(id);
      if (auto s = CheckFits(spec, job->plan()->theory, *reserved, meshes_->Workers()); !s.ok()) {
        meshes_->Release(id, "does not fit");
        ends.push_back({job, {baton::v1::JOB_FAILED, std::string(s.message())}});
        continue;
      }
      StartRunner(job, std::move(restore));
    }
    // The jobs behind the one that holds the line say so.
    for (size_t j = i + 1; !held_by.empty() && j < queue_.size(); ++j) {
      if (auto it = jobs_.find(queue_[j]); it != jobs_.end()) {
        it->second->SetWaitingFor(absl::StrCat("queued behind job ", held_by.substr(0, 512)));
      }
    }
  }
  for (auto& [job, end] : ends) EndPending(*job, end.first, end.second);
  return to_shrink;
}

void JobManager::EndPending(Job& job, baton::v1::JobState state, const std::string& cause) {
  if (!job.Enter(state, cause)) return;
  job.ReleasePrograms();
  events_->Append(JobEvent(state == baton::v1::JOB_STOPPED ? baton::v1::Event::JOB_STOPPED : baton::v1::Event::JOB_FAILED, job.id(),
                           job.step(), "", cause));
  Persist(job);
}

void JobManager::OnEnd(Job& job) {
  // RECOVERING: restored from its newest complete checkpoint (or from the
  // start: its spec's resume_from or init_from, or step 0).
  std::optional<absl::StatusOr<RestorePlan>> recovery;
  if (job.state() == baton::v1::JOB_RECOVERING) recovery = PlanRecovery(job, *job.placed_spec(), *job.plan());
  if (recovery && !recovery->ok()) {
    const std::string cause = absl::StrCat("cannot restore it after its failure: ", recovery->status().message());
    job.Enter(baton::v1::JOB_FAILED, cause);
    events_->Append(JobEvent(baton::v1::Event::JOB_FAILED, job.id(), job.step(), "", cause));
    Persist(job);
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = runners_.find(job.id());
    if (it != runners_.end()) {
      // Placing it failed for the fleet's sake (PENDING), or it failed and
      // may restart (RECOVERING): first in line again, after a pause.
      const baton::v1::RestartPolicy& policy = job.spec().restart();
      const bool pending = job.state() == baton::v1::JOB_PENDING, recovering = job.state() == baton::v1::JOB_RECOVERING;
      if ((pending || recovering) && !shutting_down_) {
        queue_.push_front(job.id());
        not_before_[job.id()] =
            absl::Now() + (pending ? options_.retry_backoff
                                   : absl::Milliseconds(policy.has_backoff_ms() ? policy.backoff_ms() : kRestartBackoffMs));
        restores_[job.id()] = pending ? it->second->restore() : std::move(**recovery);
      }
      finished_runners_.push_back(std::move(it->second));
      runners_.erase(it);
    }
  }
  if (job.ended()) job.ReleasePrograms();  // its Programs are of no more use
  Schedule();
}

absl::StatusOr<std::shared_ptr<Job>> JobManager::Find(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError("no such job");
  return it->second;
}

std::vector<std::shared_ptr<Job>> JobManager::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& id : order_) out.push_back(jobs_.at(id));
  return out;
}

absl::StatusOr<baton::v1::JobStatus> JobManager::Stop(const std::string& id, const std::string& cause) {
  auto job = Find(id);
  if (!job.ok()) return job.status();
  bool queued = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find(queue_.begin(), queue_.end(), id);
    if (it != queue_.end()) {
      queue_.erase(it);
      restores_.erase(id);
      not_before_.erase(id);
      queued = true;
    }
  }
  if (queued) {
    EndPending(**job, baton::v1::JOB_STOPPED, cause);
    Schedule();  // the ones behind it may fit now
    return (*job)->status();
  }
  // Running, or FINISHED and still holding its workers: its runner ends it
  // and frees them.
  (*job)->RequestStop(cause);
  const absl::Time give_up = absl::Now() + kStopWait;
  while (absl::Now() < give_up) {
    const bool holding = RunnerOf(id) != nullptr;
    if (!holding && ((*job)->ended() || (*job)->state() == baton::v1::JOB_PENDING)) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return (*job)->status();
}

void JobManager::Tick(absl::Time now) {
  std::vector<std::shared_ptr<Job>> lapsed;
  std::vector<std::shared_ptr<JobRunner>> reaped;
  std::vector<std::pair<std::string, baton::v1::JobState>> forgotten;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, runner] : runners_) {
      if (runner->job().lease().Lapsed(now)) lapsed.push_back(jobs_.at(id));
    }
    for (auto it = finished_runners_.begin(); it != finished_runners_.end();) {
      if ((*it)->finished()) {
        reaped.push_back(std::move(*it));
        it = finished_runners_.erase(it);
      } else {
        ++it;
      }
    }
    forgotten = Forget();
  }
  reaped.clear();  // joined here, outside the lock
  // Their files, outside the table's lock, after any write of theirs in
  // flight (which would otherwise bring a record back).
  for (const auto& [id, state] : forgotten) {
    std::shared_ptr<JobWriter> writer = WriterOf(id);
    {
      absl::MutexLock lock(&writer->mu);
      // A record that could not be read is never deleted: it stays for
      // whoever repairs it, and is listed again at the next start.
      if (state != baton::v1::JOB_UNREADABLE) store_->Remove(id).IgnoreError();
    }
    absl::MutexLock lock(&persist_mu_);
    writers_.erase(id);
    unwritten_.erase(id);
  }
  WriteProgress(/*now=*/false);
  for (const auto& job : lapsed) {
    const baton::v1::JobStatus s = job->status();
    job->RequestStop(absl::StrFormat("its lease lapsed: its client made no call for %.1f s (lease %d ms)",
                                     absl::ToDoubleMilliseconds(absl::Milliseconds(s.lease_ms())) / 1e3, s.lease_ms()));
  }
  Schedule();
}

std::vector<std::pair<std::string, baton::v1::JobState>> JobManager::Forget() {
  std::vector<std::pair<std::string, baton::v1::JobState>> forgotten;
  size_t ended = 0;
  for (const auto& id : order_) ended += jobs_.at(id)->ended();
  for (auto it = order_.begin(); it != order_.end() && ended > options_.max_ended_jobs;) {
    auto job = jobs_.find(*it);
    if (!job->second->ended() || runners_.count(*it)) {
      ++it;
      continue;
    }
    forgotten.emplace_back(*it, job->second->state());
    jobs_.erase(job);
    it = order_.erase(it);
    --ended;
  }
  return forgotten;
}

void JobManager::OnMeshLost(const std::string& owner, const baton::v1::Mesh& mesh, const std::string& why) {
  auto job = Find(owner);
  if (job.ok()) (*job)->NoteMeshLost(mesh.mesh_id(), why);
}

void JobManager::Shutdown() {
  std::vector<std::shared_ptr<JobRunner>> runners;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [id, runner] : runners_) {
      runner->job().RequestShutdown();
      runners.push_back(runner);
    }
    runners_.clear();
    for (auto& r : finished_runners_) runners.push_back(std::move(r));
    finished_runners_.clear();
  }
  runners.clear();  // each joins its thread
  WriteProgress(/*now=*/true);
}

void JobManager::WriteProgress(bool now) {
  std::set<std::string> ids;
  {
    absl::MutexLock lock(&persist_mu_);
    const absl::Time at = absl::Now();
    if (!now && at < progress_written_ + kProgressInterval) return;
    progress_written_ = at;
    ids.swap(unwritten_);
  }
  for (const std::string& id : ids) {
    auto job = Find(id);
    if (job.ok()) Persist(**job);
  }
}

std::shared_ptr<JobManager::JobWriter> JobManager::WriterOf(const std::string& id) {
  absl::MutexLock lock(&persist_mu_);
  std::shared_ptr<JobWriter>& writer = writers_[id];
  if (writer == nullptr) writer = std::make_shared<JobWriter>();
  return writer;
}

void JobManager::Persist(Job& job) {
  if (job.state() == baton::v1::JOB_UNREADABLE) return;
  {
    absl::MutexLock lock(&persist_mu_);
    unwritten_.erase(job.id());
  }
  std::shared_ptr<JobWriter> writer = WriterOf(job.id());
  absl::MutexLock lock(&writer->mu);
  absl::Status s = store_->Write(job.Record());
  if (s.ok()) {
    const std::vector<baton::v1::JobLogEntry> entries = job.log().After(writer->written);
    if (!entries.empty()) {
      s = store_->AppendLog(job.id(), entries);
      if (s.ok()) writer->written = entries.back().sequence();
    }
  }
  if (!s.ok()) Logf("job store: %s", s.ToString().c_str());
  job.SetRecordError(s.ok() ? "" : absl::StrCat("the job table could not record its last change: ", s.message()));
}

}  // namespace baton
