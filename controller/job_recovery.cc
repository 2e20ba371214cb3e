// JobManager::Recover: a controller starting on a --state_dir takes up the
// job table its predecessor left.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "common/file_root.h"
#include "program/wire.h"
#include "controller/job_manager.h"
#include "controller/resume_points.h"
#include "mesh/device_mesh.h"
#include "strategies/job_spec.h"

namespace baton {

namespace {

// The newest step a job's record or log holds.
int LoggedStep(const baton::v1::JobRecord& record, const std::vector<baton::v1::JobLogEntry>& log) {
  int step = record.status().step();
  for (const auto& e : log) {
    if (e.has_step()) step = std::max(step, static_cast<int>(e.step().step()));
  }
  return step;
}

}  // namespace

std::optional<LiveState> JobManager::LeftOnWorkers(const baton::v1::JobRecord& record,
                                                  const std::vector<baton::v1::JobLogEntry>& log,
                                                  std::shared_ptr<const JobPlan> own) {
  const baton::v1::JobStatus& status = record.status();
  // Not placed. (At step 0 by its record it may still have run steps whose
  // record the controller never wrote.)
  if (status.workers().empty()) return std::nullopt;
  // The Programs its ranks ran: its spec on the mesh it was placed on
  // (shrunk, or its own).
  baton::v1::JobSpec placed = record.spec();
  if (!status.mesh().empty()) *placed.mutable_mesh() = status.mesh();
  if (MeshSize(placed) != status.workers_size()) return std::nullopt;
  LiveState live;
  if (FormatMeshSpec(ToMeshAxes(placed.mesh())) == FormatMeshSpec(ToMeshAxes(record.spec().mesh()))) {
    live.plan = std::move(own);  // its own mesh: compiled once
  } else {
    auto plan = PlanJob(placed, status.job_id());  // shrunk
    if (!plan.ok()) return std::nullopt;
    live.plan = std::make_shared<const JobPlan>(std::move(*plan));
  }
  live.mesh.set_mesh_id(status.mesh_id());
  *live.mesh.mutable_worker_names() = status.workers();
  live.step = status.step();
  live.logged_step = LoggedStep(record, log);
  return live;
}

void JobManager::Recover() {
  const JobStore::Contents contents = store_->Read();
  int ended = 0, requeued = 0, failed = 0;
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (baton::v1::JobRecord record : contents.jobs) {
    const std::string id = record.status().job_id();
    baton::v1::JobStatus* status = record.mutable_status();
    std::shared_ptr<Job> job;
    RestorePlan restore;
    std::optional<LiveState> live;
    bool queue = false;
    std::string cause, skipped;
    if (baton::v1::RescaleState* rescale = status->mutable_rescale();
        rescale->phase() == baton::v1::RescaleState::ASKED) {
      // Asked of the controller that died: applied if its record already
      // holds the new mesh (the runner had taken it), else never will be.
      const bool taken = FormatMeshSpec(ToMeshAxes(record.spec().mesh())) == FormatMeshSpec(ToMeshAxes(rescale->mesh()));
      rescale->set_phase(taken ? baton::v1::RescaleState::APPLIED : baton::v1::RescaleState::FAILED);
      if (rescale->phase() == baton::v1::RescaleState::FAILED) {
        rescale->set_error("the controller restarted before the runner took it");
      }
    }
    if (IsEnded(status->state())) {
      ++ended;
    } else if (!status->detached()) {
      // Its client held it through the controller that died: the client's
      // next call is answered with this.
      cause = absl::StrCat("the controller restarted (start ", contents.starts, " on ", store_->dir(),
                           ") while the job's client held it",
                           status->last_checkpoint().path().empty()
                               ? ""
                               : absl::StrCat("; its last checkpoint is ", status->last_checkpoint().path()));
      ++failed;
    } else {
      // Detached: back in line, from the state its workers kept when they
      // still hold all of it, else from its last complete checkpoint (or the
      // one its spec resumes from, or step 0).
      const baton::v1::JobRecord ran = record;  // where it ran: for LeftOnWorkers below
      status->set_resumes(status->resumes() + 1);
      status->clear_mesh_id();
      status->clear_workers();
      status->set_state(baton::v1::JOB_PENDING);
      std::optional<Prepared> prepared;
      std::map<std::string, std::string> lost;
      const std::vector<std::string> points = ResumePoints(record, options_.checkpoints.file_root, {}, &lost);
      absl::Status compiled = FromNewest(
          points, lost,
          [&](const std::string& point) {
            auto p = Compile(record, point);
            if (p.ok()) prepared = std::move(*p);
            return p.status();
          },
          &skipped);
      if (compiled.ok()) {
        const std::vector<baton::v1::JobLogEntry>& logged =
            contents.logs.count(id) ? contents.logs.at(id) : std::vector<baton::v1::JobLogEntry>{};
        live = LeftOnWorkers(ran, logged, prepared->job->plan());
        job = prepared->job;
        restore = std::move(prepared->restore);
        restore.logged_step = LoggedStep(ran, logged);
        queue = true;
        ++requeued;
      } else {
        cause = absl::StrCat("the controller restarted and cannot resume it: ", compiled.message());
        ++failed;
      }
    }
    if (job == nullptr) {
      // Ended (or ending now): nothing to run, so no plan.
      job = std::make_shared<Job>(record, std::make_shared<const JobPlan>());
    }
    for (const auto& e : contents.logs.count(id) ? contents.logs.at(id) : std::vector<baton::v1::JobLogEntry>{}) {
      job->log().Restore(e);
    }
    // The controller that died numbered entries it never wrote: this one's
    // follow them all (start N numbers from N << 32, and past the block of
    // the last one read, should the counters have been lost), so a client following
    // the log across the restart (after its last sequence) misses none.
    job->log().SkipTo(std::max<int64_t>(contents.starts, (job->log().last_sequence() >> 32) + 1) << 32);
    {
      std::shared_ptr<JobWriter> writer = WriterOf(id);
      absl::MutexLock lock(&writer->mu);
      writer->written = job->log().last_sequence();
    }
    if (IsEnded(record.status().state())) job->log().Close();
    if (!cause.empty()) {
      job->Enter(baton::v1::JOB_FAILED, cause);
      events_->Append(JobEvent(baton::v1::Event::JOB_FAILED, id, job->step(), "", cause));
    } else if (queue) {
      job->Enter(baton::v1::JOB_PENDING,
                 absl::StrCat(restore.info.path().empty()
                                  ? "requeued after a controller restart; starts from step 0"
                                  : absl::StrCat("requeued after a controller restart; resumes from ",
                                                 restore.info.path(), " (step ", restore.info.step(), ")"),
                              live.has_value() ? absl::StrCat(" unless its workers still hold its state at step ",
                                                              live->step, " or later")
                                               : "",
                              skipped.empty() ? "" : absl::StrCat("; newer checkpoints cannot be loaded: ", skipped)));
      events_->Append(JobEvent(baton::v1::Event::JOB_REQUEUED, id, job->step(),
                               restore.info.path().empty() ? "from step 0" : absl::StrCat("from ", restore.info.path()),
                               "the controller restarted"));
    }
    std::shared_ptr<JobSupervisor> supervisor;
    {
      absl::MutexLock lock(&mu_);
      jobs_[id] = job;
      order_.push_back(id);
      if (queue) {
        queue_.push_back(id);
        supervisor = Supervise(job, std::move(restore));
        // Placed on the workers it ran on while they come back (then on
        // any): in place, its restore moves nothing.
        if (live.has_value()) supervisor->ResumeOn(std::move(*live), absl::Now() + options_.registration_grace);
      }
    }
    Persist(*job);
    if (supervisor != nullptr) supervisor->Start();
  }
  // A record that cannot be read stays listed, UNREADABLE with why, and its
  // file stays as it is (nothing writes it): its id is never handed out
  // again, and whoever repairs the file finds it at the next start.
  for (const auto& [id, why] : contents.unreadable) {
    baton::v1::JobRecord record;
    record.mutable_status()->set_job_id(id);
    record.mutable_status()->set_state(baton::v1::JOB_UNREADABLE);
    record.mutable_status()->set_error(absl::StrCat("its record cannot be read: ", why));
    auto job = std::make_shared<Job>(record, std::make_shared<const JobPlan>());
    job->log().Close();
    events_->Append(JobEvent(baton::v1::Event::JOB_FAILED, id, 0, "", record.status().error()));
    absl::MutexLock lock(&mu_);
    jobs_[id] = job;
    order_.push_back(id);
  }
  baton::v1::Event e;
  e.set_kind(baton::v1::Event::CONTROLLER_STARTED);
  e.set_rank(-1);
  e.set_detail(store_->persistent()
                   ? absl::StrFormat("start %d on %s: %d jobs read (%d ended, %d requeued, %d failed)%s%s%s",
                                     contents.starts, store_->dir(), contents.jobs.size(), ended, requeued, failed,
                                     store_->open_error().empty()
                                         ? ""
                                         : absl::StrCat("; ", store_->open_error()),
                                     contents.unreadable.empty()
                                         ? ""
                                         : absl::StrCat("; ", contents.unreadable.size(),
                                                        " records unreadable, listed as JOB_UNREADABLE: ",
                                                        contents.unreadable.front().second),
                                     contents.log_errors.empty()
                                         ? ""
                                         : absl::StrCat("; ", contents.log_errors.size(), " logs unreadable: ",
                                                        contents.log_errors.front()))
                   : "no --state_dir: jobs do not outlive this controller");
  e.set_time_unix_ms(now_ms);
  events_->Append(std::move(e));
  Schedule();
}

}  // namespace baton
