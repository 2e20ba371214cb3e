// JobManager::Recover: a controller starting on a --state_dir takes up the
// job table its predecessor left.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "common/file_root.h"
#include "controller/job_manager.h"
#include "strategies/job_spec.h"

namespace baton {

// Where a requeued job resumes: the checkpoint its record names, or - when
// that one is gone (published, then pruned by keep_last after a newer one,
// before the record said so) - the newest complete checkpoint of its own
// directory past it. "" when neither: the spec's resume_from, or step 0.
std::string JobManager::ResumePoint(const baton::v1::JobRecord& record, const std::string& file_root) {
  const baton::v1::CheckpointInfo& recorded = record.status().last_checkpoint();
  if (!recorded.path().empty() && ReadMetadata(recorded.path()).ok()) return recorded.path();
  if (record.spec().checkpoint().dir().empty()) return "";
  auto dir = ResolveUnderRoot(file_root, record.spec().checkpoint().dir());
  if (!dir.ok()) return "";
  const auto all = ListCheckpoints(*dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->first > recorded.step() && it->first <= record.spec().steps()) return it->second;
  }
  return "";
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
    bool queue = false;
    std::string cause;
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
      // Detached: back in line, from its last complete checkpoint (or the
      // one its spec resumes from, or step 0).
      status->set_resumes(status->resumes() + 1);
      status->clear_mesh_id();
      status->clear_workers();
      status->set_state(baton::v1::JOB_PENDING);
      auto prepared = Compile(record, ResumePoint(record, options_.checkpoints.file_root));
      if (prepared.ok()) {
        job = prepared->job;
        restore = std::move(prepared->restore);
        queue = true;
        ++requeued;
      } else {
        cause = absl::StrCat("the controller restarted and cannot resume it: ", prepared.status().message());
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
    {
      absl::MutexLock lock(&persist_mu_);
      persisted_[id] = job->log().last_sequence();
    }
    if (IsEnded(record.status().state())) job->log().Close();
    if (!cause.empty()) {
      job->Enter(baton::v1::JOB_FAILED, cause);
      events_->Append(JobEvent(baton::v1::Event::JOB_FAILED, id, job->step(), "", cause));
    } else if (queue) {
      job->Enter(baton::v1::JOB_PENDING,
                 restore.info.path().empty() ? "requeued after a controller restart; starts from step 0"
                                             : absl::StrCat("requeued after a controller restart; resumes from ",
                                                            restore.info.path(), " (step ", restore.info.step(), ")"));
      events_->Append(JobEvent(baton::v1::Event::JOB_REQUEUED, id, job->step(),
                               restore.info.path().empty() ? "from step 0" : absl::StrCat("from ", restore.info.path()),
                               "the controller restarted"));
    }
    {
      absl::MutexLock lock(&mu_);
      jobs_[id] = job;
      order_.push_back(id);
      if (queue) {
        queue_.push_back(id);
        restores_[id] = std::move(restore);
      }
    }
    Persist(*job);
  }
  baton::v1::Event e;
  e.set_kind(baton::v1::Event::CONTROLLER_STARTED);
  e.set_rank(-1);
  e.set_detail(store_->persistent()
                   ? absl::StrFormat("start %d on %s: %d jobs read (%d ended, %d requeued, %d failed)%s",
                                     contents.starts, store_->dir(), contents.jobs.size(), ended, requeued, failed,
                                     contents.unreadable.empty()
                                         ? ""
                                         : absl::StrCat("; ", contents.unreadable.size(), " files unreadable: ",
                                                        contents.unreadable.front()))
                   : "no --state_dir: jobs do not outlive this controller");
  e.set_time_unix_ms(now_ms);
  events_->Append(std::move(e));
  Schedule();
}

}  // namespace baton
