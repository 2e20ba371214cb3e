#include "controller/job_trace.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace baton {

void JobTrace::Arm(int steps) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kArmed || (state_ == State::kRecorded && !taken_)) return;
  state_ = State::kArmed;
  taken_ = false;
  wanted_ = std::clamp(steps, 1, kMaxSteps);
  recorded_ = Recorded();
}

bool JobTrace::Wants(int first) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kArmed) return false;
  // A call past the armed steps need not record (one started ahead of the
  // call that completes the trace); any other may be needed (a job
  // restored at an earlier step records again).
  return recorded_.steps == 0 || first < recorded_.first_step + wanted_;
}

void JobTrace::Collect(const baton::v1::Mesh& mesh, const std::shared_ptr<const JobPlan>& plan, int first,
                       const std::vector<const baton::v1::RunStepResponse*>& by_rank) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kArmed || by_rank.empty()) return;
  const int k = by_rank[0]->traces_size();
  for (const baton::v1::RunStepResponse* r : by_rank) {
    if (r->traces_size() != k) return;  // a rank that did not record: not this call
  }
  if (k == 0) return;
  // Steps that do not follow those recorded, or another mesh: start over.
  const bool follows = recorded_.steps > 0 && recorded_.mesh.epoch() == mesh.epoch() &&
                       first == recorded_.first_step + recorded_.steps;
  if (!follows) {
    recorded_ = Recorded();
    recorded_.mesh = mesh;
    recorded_.plan = plan;
    recorded_.first_step = first;
    recorded_.by_rank.assign(by_rank.size(), {});
    recorded_.io_by_rank.assign(by_rank.size(), {});
  }
  const int take = std::min(k, wanted_ - recorded_.steps);
  for (size_t r = 0; r < by_rank.size(); ++r) {
    for (int i = 0; i < take; ++i) recorded_.by_rank[r].push_back(by_rank[r]->traces(i));
  }
  recorded_.steps += take;
  if (recorded_.steps >= wanted_) state_ = State::kRecorded;
}

void JobTrace::AddIo(int64_t epoch, int step, const std::vector<std::vector<baton::v1::TraceSpan>>& by_rank) {
  absl::MutexLock lock(&mu_);
  const bool open = state_ == State::kArmed || (state_ == State::kRecorded && !taken_);
  if (!open || recorded_.steps == 0 || recorded_.mesh.epoch() != epoch || step < recorded_.first_step ||
      step >= recorded_.first_step + recorded_.steps || by_rank.size() != recorded_.io_by_rank.size()) {
    return;
  }
  for (size_t r = 0; r < by_rank.size(); ++r) {
    recorded_.io_by_rank[r].insert(recorded_.io_by_rank[r].end(), by_rank[r].begin(), by_rank[r].end());
  }
}

std::string JobTrace::Progress() const {
  return absl::StrCat(recorded_.steps, " of ", wanted_, " steps recorded");
}

absl::StatusOr<JobTrace::Recorded> JobTrace::Await(absl::Time deadline, const std::function<std::string()>& gone) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kIdle) return absl::FailedPreconditionError("no trace is armed");
  auto recorded = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ == State::kRecorded; };
  while (!mu_.AwaitWithDeadline(absl::Condition(&recorded), std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
    if (absl::Now() >= deadline) {
      state_ = State::kIdle;  // nobody waits for it any more: the steps stop recording
      return absl::DeadlineExceededError(absl::StrCat("the trace timed out with ", Progress(),
                                                      " (an attached job steps when its client asks)"));
    }
    mu_.Unlock();
    const std::string why = gone();
    mu_.Lock();
    if (!why.empty() && state_ != State::kRecorded) {
      state_ = State::kIdle;
      return absl::FailedPreconditionError(absl::StrCat(why, ": the trace ended with ", Progress()));
    }
  }
  taken_ = true;
  return recorded_;
}

}  // namespace baton
