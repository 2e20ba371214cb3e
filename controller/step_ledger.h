// StepLedger: the steps asked of a job and how far they got. A detached
// job asks for all of them; an attached job's client asks for `n` more
// (after those recorded and on the wire) and withdraws what has not started
// when it stops waiting. Steps go on the wire, are recorded (the job's step)
// and are settled (their periodic save done too).
//
//   asked (target) >= on the wire + recorded >= settled
//
// Not thread-safe: a Job holds it under its lock, where the decisions that
// read it with the job's state and interrupt (Job::Outlook, AwaitWork) are
// taken at once. The recorded step is the job's (JobStatus.step), passed in.
#ifndef BATON_CONTROLLER_STEP_LEDGER_H_
#define BATON_CONTROLLER_STEP_LEDGER_H_

#include <algorithm>

#include "absl/time/time.h"

namespace baton {

class StepLedger {
 public:
  // A job of `steps` steps at `step`, nothing asked yet.
  StepLedger(int step, int steps, bool detached)
      : steps_(steps), detached_(detached), target_(step), settled_(step) {}

  // Placed (again) at `step`: a detached job asks for every step left, an
  // attached one for none until its client does.
  void Restart(int step) {
    target_ = detached_ ? steps_ : step;
    settled_ = step;
    running_ = 0;
  }
  // `n` more after the recorded `step` and those on the wire, answered by
  // `answer_by`; the step to wait for.
  int Request(int n, absl::Time answer_by, int step) {
    answer_by_ = answer_by;
    target_ = std::min(steps_, std::max(target_, step + running_ + std::max(n, 0)));
    return target_;
  }
  // The client stopped waiting: what has not started is no longer asked.
  void Withdraw(int step) {
    if (!detached_) target_ = std::min(target_, step + running_);
  }
  // `n` more steps on the wire; one off it as it is recorded; none after a
  // failed call.
  void Start(int n) { running_ += n; }
  void Recorded() { running_ = std::max(0, running_ - 1); }
  void ClearRunning() { running_ = 0; }
  void Settle(int step) { settled_ = std::max(settled_, step); }

  int target() const { return target_; }
  bool has_work(int step) const { return target_ > step; }
  bool settled(int step) const { return settled_ >= step; }
  absl::Time answer_by() const { return answer_by_; }
  // An attached job's client's K: up to this many steps per call; 0: the
  // runner chooses.
  int steps_per_call() const { return steps_per_call_; }
  void set_steps_per_call(int k) { steps_per_call_ = std::max(0, k); }

 private:
  const int steps_;
  const bool detached_;
  int target_;
  int running_ = 0;
  int settled_;
  absl::Time answer_by_ = absl::InfiniteFuture();
  int steps_per_call_ = 1;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_STEP_LEDGER_H_
