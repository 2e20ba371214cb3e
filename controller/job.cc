#include "controller/job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {

using baton::v1::JobState;

namespace {

// Restarts a detached job gets when its spec says nothing (as JobSet's and
// Ray Train's defaults are a few).
constexpr int kDefaultDetachedRestarts = 3;

}  // namespace

Job::Job(baton::v1::JobRecord record, std::shared_ptr<const JobPlan> plan)
    : id_(record.status().job_id()),
      spec_(std::move(*record.mutable_spec())),
      detached_(record.status().detached()),
      restarts_allowed_(spec_.restart().has_max_restarts() ? spec_.restart().max_restarts()
                        : detached_                           ? kDefaultDetachedRestarts
                                                              : 0),
      lease_(absl::Milliseconds(record.status().lease_ms()), !record.status().detached()),
      placement_(JobPlacement::Own(spec_, std::move(plan))),
      status_(std::move(*record.mutable_status())),
      ledger_(status_.step(), status_.steps(), detached_) {}

int Job::checkpoint_failures() const {
  absl::MutexLock lock(&mu_);
  return status_.checkpoint_failures();
}

void Job::SetRecordError(const std::string& why) {
  absl::MutexLock lock(&mu_);
  status_.set_record_error(why);
}

std::shared_ptr<const JobPlan> Job::plan() const {
  absl::MutexLock lock(&mu_);
  return placement_->plan;
}

void Job::ReleasePrograms() {
  absl::MutexLock lock(&mu_);
  placement_ = placement_->WithoutPrograms();
}

baton::v1::JobStatus Job::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

JobState Job::state() const {
  absl::MutexLock lock(&mu_);
  return status_.state();
}

int Job::step() const {
  absl::MutexLock lock(&mu_);
  return status_.step();
}

bool Job::ended() const { return IsEnded(state()); }

baton::v1::JobRecord Job::Record() const {
  baton::v1::JobRecord record;
  absl::MutexLock lock(&mu_);
  *record.mutable_spec() = *placement_->own;  // its mesh as last rescaled
  *record.mutable_status() = status_;
  record.mutable_status()->clear_record_error();  // about this controller's writes only
  return record;
}

void Job::LogState() {
  baton::v1::JobLogEntry entry;
  *entry.mutable_state() = status_;
  entry.mutable_state()->clear_last();
  log_.Add(std::move(entry));
}

bool Job::Enter(JobState to, const std::string& cause) {
  {
    absl::MutexLock lock(&mu_);
    if (IsEnded(status_.state())) return false;
    const int64_t now = absl::ToUnixMillis(absl::Now());
    status_.set_state(to);
    if (to != baton::v1::JOB_PENDING) status_.clear_waiting_for();
    if (to == baton::v1::JOB_RUNNING) status_.set_started_unix_ms(now);
    // A rescale taken by the runner is applied once the job runs again (on
    // its new mesh); one the job ended before is failed, saying how.
    baton::v1::RescaleState* rescale = status_.mutable_rescale();
    if (rescale->phase() == baton::v1::RescaleState::ASKED) {
      if (to == baton::v1::JOB_RUNNING && !rescale_.has_value()) {
        rescale->set_phase(baton::v1::RescaleState::APPLIED);
      } else if (IsEnded(to)) {
        rescale->set_phase(baton::v1::RescaleState::FAILED);
        rescale->set_error(absl::StrCat("the job was ", baton::v1::JobState_Name(to), " before it was rescaled",
                                        cause.empty() ? "" : absl::StrCat(": ", cause)));
      }
    }
    if (to == baton::v1::JOB_FAILED || to == baton::v1::JOB_STOPPED) status_.set_error(cause);
    if (to == baton::v1::JOB_PENDING && !cause.empty()) status_.set_waiting_for(cause);
    if (IsEnded(to)) {
      status_.set_ended_unix_ms(now);
      status_.set_checkpoint_in_flight_step(0);
    }
    LogState();
  }
  if (IsEnded(to)) log_.Close();
  return true;
}

void Job::SetMesh(const baton::v1::Mesh& mesh) {
  absl::MutexLock lock(&mu_);
  status_.set_mesh_id(mesh.mesh_id());
  *status_.mutable_workers() = mesh.worker_names();
}

void Job::SetWaitingFor(const std::string& what) {
  absl::MutexLock lock(&mu_);
  status_.set_waiting_for(what);
}

void Job::SetStart(int step, uint64_t data_seed, const baton::v1::CheckpointInfo& restored) {
  absl::MutexLock lock(&mu_);
  *status_.mutable_restored() = restored;
  status_.set_step(step);
  status_.set_start_step(step);
  status_.set_data_seed(data_seed);
  ledger_.Restart(step);
}

void Job::RecordStep(const baton::v1::StepMetrics& m, int64_t comm_bytes) {
  baton::v1::JobLogEntry entry;
  *entry.mutable_step() = m;
  {
    absl::MutexLock lock(&mu_);
    status_.set_step(m.step());
    ledger_.Recorded();  // with the count, so no caller sees both
    *status_.mutable_last() = m;
    status_.set_comm_bytes_total(status_.comm_bytes_total() + comm_bytes);
    status_.set_tokens_total(status_.tokens_total() + m.tokens());
    // Logged under the lock: the log's order is the steps' order.
    log_.Add(std::move(entry));
  }
}

void Job::RecordCheckpoint(const baton::v1::CheckpointInfo& info) {
  baton::v1::JobLogEntry entry;
  *entry.mutable_checkpoint() = info;
  absl::MutexLock lock(&mu_);
  *status_.mutable_last_checkpoint() = info;
  status_.clear_checkpoint_error();
  status_.set_checkpoint_failures(0);
  log_.Add(std::move(entry));
}

int Job::RecordCheckpointFailure(const std::string& why, bool periodic) {
  baton::v1::JobLogEntry entry;
  entry.set_checkpoint_error(why);
  absl::MutexLock lock(&mu_);
  status_.set_checkpoint_error(why);
  if (periodic) status_.set_checkpoint_failures(status_.checkpoint_failures() + 1);
  status_.set_checkpoint_failures_total(status_.checkpoint_failures_total() + 1);
  log_.Add(std::move(entry));
  return status_.checkpoint_failures();
}

void Job::SetCheckpointInFlight(int step) {
  absl::MutexLock lock(&mu_);
  status_.set_checkpoint_in_flight_step(step);
}

void Job::RequestStop(const std::string& cause) {
  absl::MutexLock lock(&mu_);
  if (interrupt_ == Interrupt::kNone) {
    interrupt_ = Interrupt::kStop;
    interrupt_cause_ = cause;
  }
}

void Job::NoteMeshLost(const std::string& mesh_id, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (interrupt_ == Interrupt::kNone && !mesh_id.empty() && mesh_id == status_.mesh_id()) {
    interrupt_ = Interrupt::kMeshLost;
    interrupt_cause_ = why;
  }
}

void Job::RequestShutdown() {
  absl::MutexLock lock(&mu_);
  if (interrupt_ == Interrupt::kNone) {
    interrupt_ = Interrupt::kShutdown;
    interrupt_cause_ = "the controller is shutting down";
  }
}

Job::Interrupt Job::interrupt(std::string* why) const {
  absl::MutexLock lock(&mu_);
  if (why != nullptr) *why = interrupt_cause_;
  return interrupt_;
}

int Job::RequestSteps(int n, const CallSettings& settings) {
  absl::MutexLock lock(&mu_);
  return ledger_.Request(n, settings, status_.step());
}

void Job::WithdrawSteps() {
  absl::MutexLock lock(&mu_);
  ledger_.Withdraw(status_.step());
}

Job::Outlook Job::OutlookLocked() const {
  Outlook o;
  o.interrupt = interrupt_;
  o.why = interrupt_cause_;
  o.step = status_.step();
  o.target_step = ledger_.target();
  o.call = ledger_.settings();
  o.rescale_asked = rescale_.has_value();
  o.shrunk = placement_->shrunk();
  o.checkpoint_failures = status_.checkpoint_failures();
  return o;
}

Job::Outlook Job::outlook() const {
  absl::MutexLock lock(&mu_);
  return OutlookLocked();
}

Job::Outlook Job::AwaitWork(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return interrupt_ != Interrupt::kNone || ledger_.has_work(status_.step()) || rescale_.has_value();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return OutlookLocked();
}

void Job::AddStepsRunning(int n) {
  absl::MutexLock lock(&mu_);
  ledger_.Start(n);
}

void Job::ClearStepsRunning() {
  absl::MutexLock lock(&mu_);
  ledger_.ClearRunning();
}

void Job::SettleStep(int step) {
  absl::MutexLock lock(&mu_);
  ledger_.Settle(step);
}

bool Job::AwaitStep(int step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ledger_.settled(step) || IsEnded(status_.state());
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  // Settled, not only recorded: a step is recorded before its periodic save
  // runs, and a caller woken by its deadline in between must not report it
  // apart from that save's outcome.
  return ledger_.settled(step);
}

void Job::AwaitPlaced(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto placed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_.state() != baton::v1::JOB_PENDING; };
  mu_.AwaitWithDeadline(absl::Condition(&placed), deadline);
}

}  // namespace baton
