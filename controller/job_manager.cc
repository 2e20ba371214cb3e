// JobManager: the queue and its schedule, stopping, the monitor's tick,
// the job table's writes. Admission is in job_admission.cc, recovery at
// start-up in job_recovery.cc, and the calls an attached job's client
// makes in job_calls.cc; each job's life is its supervisor's
// (job_supervisor.h).
#include "controller/job_manager.h"

#include <algorithm>
#include <optional>
#include <map>
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

std::shared_ptr<JobSupervisor> JobManager::Supervise(const std::shared_ptr<Job>& job, RestorePlan restore) {
  SupervisorContext context;
  context.runner.meshes = meshes_;
  context.runner.events = events_;
  context.runner.metrics = metrics_;
  context.runner.checkpoints = options_.checkpoints;
  context.runner.collective_timeout_ms = options_.collective_timeout_ms;
  context.runner.persist = [this](Job& j) { Persist(j); };
  context.runner.persist_progress = [this](Job& j) {
    absl::MutexLock lock(&persist_mu_);
    unwritten_.insert(j.id());
  };
  context.retry_backoff = options_.retry_backoff;
  context.requeue = [this](const std::string& id) { Requeue(id); };
  context.done = [this](const std::string& id) { Done(id); };
  auto supervisor = std::make_shared<JobSupervisor>(job, std::move(restore), std::move(context));
  supervisors_[job->id()] = supervisor;
  return supervisor;
}

void JobManager::Requeue(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    if (std::find(queue_.begin(), queue_.end(), id) == queue_.end()) queue_.push_front(id);
  }
  Schedule();
}

void JobManager::Done(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
    if (auto it = supervisors_.find(id); it != supervisors_.end()) {
      finished_.push_back(std::move(it->second));  // its thread is returning: joined by Tick
      supervisors_.erase(it);
    }
  }
  Schedule();  // its workers are free
}

void JobManager::Schedule() {
  std::vector<std::pair<std::shared_ptr<JobSupervisor>, std::string>> stops;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    // First in line, first placed. A job that cannot be placed yet and waits
    // for workers it names (its own after a failure, or its spec's) keeps
    // them, and the jobs behind it that fit on other free workers start
    // meanwhile (backfill): they take nothing it waits for. One that waits
    // for a number of workers holds the line: whatever started behind it
    // would take workers it waits for, and it could wait forever.
    // Each kind of device has its own line: a CUDA job waiting for GPUs
    // holds no CPU job back, nor the other way round.
    std::set<std::string> kept;  // workers named by waiting jobs ahead
    std::map<baton::v1::DeviceKind, std::string> held_by;  // per kind: the job that holds its line, and why
    std::map<baton::v1::DeviceKind, int> ahead;            // per kind: jobs still queued ahead
    size_t i = 0;
    while (!shutting_down_ && i < queue_.size()) {
      const std::string id = queue_[i];
      auto it = supervisors_.find(id);
      std::shared_ptr<JobSupervisor> supervisor = it == supervisors_.end() ? nullptr : it->second;
      std::string cause;
      if (supervisor == nullptr || supervisor->job().ended() ||
          supervisor->job().interrupt(&cause) == Job::Interrupt::kStop) {
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
        if (supervisor != nullptr && !supervisor->job().ended()) stops.emplace_back(supervisor, cause);
        continue;
      }
      Job& job = supervisor->job();
      const baton::v1::DeviceKind kind = JobDeviceKind(job.spec());
      // It stays queued, saying why; holding its kind's line, the jobs of
      // that kind behind it wait too.
      auto wait = [&](const std::string& why, bool holds_line) {
        job.SetWaitingFor(why);
        if (holds_line) held_by[kind] = absl::StrCat(id, ", which ", why);
        ++ahead[kind];
        ++i;
      };
      if (auto held = held_by.find(kind); held != held_by.end()) {
        wait(absl::StrCat("queued behind job ", held->second.substr(0, 512)), false);
        continue;
      }
      const JobSupervisor::Wants wants = supervisor->wants(now);
      if (now < wants.not_before || wants.shrinking) {
        held_by[kind] = absl::StrCat(id, now < wants.not_before ? ", which waits before it restarts"
                                                               : ", which is being shrunk onto the workers left");
        ++ahead[kind];
        ++i;
        continue;
      }
      // A restart waits for the workers it ran on for a while, then takes
      // what its spec allows - or, too few being free, shrinks if it may.
      std::vector<std::string> names = wants.own_workers;
      const bool waits_for_its_own = !names.empty();
      if (names.empty()) names.assign(job.spec().workers().begin(), job.spec().workers().end());
      std::string taken;
      for (const std::string& n : names) {
        if (kept.count(n)) taken = n;
      }
      if (!taken.empty()) {
        wait(absl::StrCat("worker ", taken.substr(0, 128), ", which a job ahead of it waits for"), false);
        continue;
      }
      // Not the workers kept for the jobs ahead, nor those it keeps off.
      std::set<std::string> exclude = kept;
      exclude.insert(wants.avoid.begin(), wants.avoid.end());
      auto reserved = meshes_->Reserve(id, job.placement()->workers(), names, exclude, kind);
      if (!reserved.ok()) {
        // Its supervisor shrinks it, on its own thread; it holds the line
        // meanwhile (it waits for a number of workers).
        if (ahead[kind] == 0 && !waits_for_its_own && job.state() == baton::v1::JOB_RECOVERING) {
          supervisor->AskShrink();
        }
        if (!names.empty()) kept.insert(names.begin(), names.end());
        wait(std::string(reserved.status().message()), names.empty());
        continue;
      }
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
      supervisor->Place(std::move(*reserved));
    }
  }
  for (auto& [supervisor, cause] : stops) supervisor->Stop(cause);
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
  std::shared_ptr<JobSupervisor> supervisor;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find(queue_.begin(), queue_.end(), id);
    if (it != queue_.end()) {
      queue_.erase(it);
      queued = true;
    }
    if (auto s = supervisors_.find(id); s != supervisors_.end()) supervisor = s->second;
  }
  if (supervisor == nullptr) return (*job)->status();  // ended already
  // Queued, its supervisor ends it; running (or FINISHED and still holding
  // its workers), its runner does, and frees them.
  supervisor->Stop(cause);
  if (queued) Schedule();  // the ones behind it may fit now
  const absl::Time give_up = absl::Now() + kStopWait;
  while (absl::Now() < give_up) {
    if ((*job)->ended() && !supervisor->holds_workers()) break;
    // Shut down meanwhile: left as it is.
    if (!queued && (*job)->state() == baton::v1::JOB_PENDING && !supervisor->holds_workers()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return (*job)->status();
}

void JobManager::Tick(absl::Time now) {
  std::vector<std::shared_ptr<Job>> lapsed;
  std::vector<std::shared_ptr<JobSupervisor>> reaped;
  std::vector<std::pair<std::string, baton::v1::JobState>> forgotten;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, supervisor] : supervisors_) {
      if (supervisor->holds_workers() && supervisor->job().lease().Lapsed(now)) lapsed.push_back(supervisor->shared_job());
    }
    for (auto it = finished_.begin(); it != finished_.end();) {
      if ((*it)->done()) {
        reaped.push_back(std::move(*it));
        it = finished_.erase(it);
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
    if (!job->second->ended() || supervisors_.count(*it)) {
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
  std::vector<std::shared_ptr<JobSupervisor>> supervisors;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [id, supervisor] : supervisors_) supervisors.push_back(supervisor);
    supervisors_.clear();
    for (auto& s : finished_) supervisors.push_back(std::move(s));
    finished_.clear();
  }
  for (auto& supervisor : supervisors) supervisor->Shutdown();
  supervisors.clear();  // each joins its thread
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
