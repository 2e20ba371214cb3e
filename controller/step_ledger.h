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
#include <cstdint>

#include "absl/time/time.h"

namespace baton {

// What the call that asked for steps says about running them: they travel
// with its ask, not through the job (the newest ask's hold).
struct CallSettings {
  // Up to this many steps per call to the workers; 0: the runner chooses
  // (a detached job's are always the runner's).
  int steps_per_call = 1;
  // Each collective's timeout on the workers.
  int64_t collective_timeout_ms = 30000;
  // When the asking client stops waiting (its call's deadline): the runner
  // starts no step it expects to start later.
  absl::Time answer_by = absl::InfiniteFuture();
};

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
  // `n` more after the recorded `step` and those on the wire, run as
  // `settings` say; the step to wait for.
  int Request(int n, const CallSettings& settings, int step) {
    settings_ = settings;
    settings_.steps_per_call = std::max(0, settings.steps_per_call);
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
  const CallSettings& settings() const { return settings_; }

 private:
  const int steps_;
  const bool detached_;
  int target_;
  int running_ = 0;
  int settled_;
  CallSettings settings_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_STEP_LEDGER_H_
