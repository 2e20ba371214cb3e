// Job: its placement as it is swapped (shrunk onto the workers left, grown
// back, rescaled: controller/job_placement.h), a rescale asked for, and its
// failures and restarts. The rest of Job is in job.cc.
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "program/wire.h"
#include "controller/job.h"
#include "mesh/device_mesh.h"

namespace baton {

std::shared_ptr<const JobPlacement> Job::placement() const {
  absl::MutexLock lock(&mu_);
  return placement_;
}

void Job::Place(std::shared_ptr<const JobPlacement> placement) {
  absl::MutexLock lock(&mu_);
  *status_.mutable_mesh() = placement->spec->mesh();
  status_.set_workers_needed(placement->workers());
  placement_ = std::move(placement);
}

absl::Status Job::RequestRescale(baton::v1::JobSpec own, std::shared_ptr<const JobPlan> plan,
                                 const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (status_.state() != baton::v1::JOB_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id_, " is ", baton::v1::JobState_Name(status_.state()),
                                                      "; only a running job is rescaled"));
  }
  const baton::v1::RescaleState& last = status_.rescale();
  if (last.phase() == baton::v1::RescaleState::ASKED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " is already being rescaled to ", FormatMeshSpec(ToMeshAxes(last.mesh())),
                     last.request_id().empty() ? "" : absl::StrCat(" (request ", last.request_id(), ")"),
                     "; one rescale at a time: ask again once it runs on that mesh"));
  }
  baton::v1::RescaleState asked;
  asked.set_request_id(request_id);
  *asked.mutable_mesh() = own.mesh();
  asked.set_phase(baton::v1::RescaleState::ASKED);
  *status_.mutable_rescale() = std::move(asked);
  rescale_.emplace(std::move(own), std::move(plan));
  return absl::OkStatus();
}

bool Job::TakeRescale(baton::v1::JobSpec* own, std::shared_ptr<const JobPlan>* plan) {
  absl::MutexLock lock(&mu_);
  if (!rescale_.has_value()) return false;
  *own = std::move(rescale_->first);
  *plan = std::move(rescale_->second);
  rescale_.reset();
  return true;
}

bool Job::NoteFailure(const std::string& cause) {
  absl::MutexLock lock(&mu_);
  baton::v1::JobFailure* f = status_.add_failures();
  f->set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
  f->set_step(status_.step());
  f->set_cause(cause);
  if (status_.restarts() >= restarts_allowed_) return false;
  status_.set_restarts(status_.restarts() + 1);
  // In the same update as the failure: a reader that sees it counted sees
  // the job RECOVERING, never RUNNING on the mesh it lost.
  if (!IsEnded(status_.state())) {
    status_.set_state(baton::v1::JOB_RECOVERING);
    status_.clear_waiting_for();
    LogState();
  }
  return true;
}

std::string Job::FailureHistory() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrCat(status_.failures_size(), " failure", status_.failures_size() == 1 ? "" : "s", " (",
                                 status_.restarts(), " of ", restarts_allowed_, " restarts used)");
  for (const auto& f : status_.failures()) {
    absl::StrAppend(&out, "\n  ", absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::FromUnixMillis(f.time_unix_ms()),
                                                   absl::UTCTimeZone()),
                    " at step ", f.step(), ": ", f.cause());
  }
  return out;
}

void Job::RecordStraggler(baton::v1::Straggler straggler) {
  absl::MutexLock lock(&mu_);
  auto* list = status_.mutable_stragglers();
  *list->Add() = std::move(straggler);
  if (list->size() > kMaxStragglers) list->DeleteSubrange(0, list->size() - kMaxStragglers);
}

void Job::RecordRankTimes(std::vector<baton::v1::RankTime> times) {
  absl::MutexLock lock(&mu_);
  status_.clear_rank_times();
  for (baton::v1::RankTime& t : times) *status_.add_rank_times() = std::move(t);
}

void Job::ClearMeshLost() {
  absl::MutexLock lock(&mu_);
  if (interrupt_ == Interrupt::kMeshLost) {
    interrupt_ = Interrupt::kNone;
    interrupt_cause_.clear();
  }
}

}  // namespace baton
