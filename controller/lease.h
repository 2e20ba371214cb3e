// Lease: an attached job's hold on its workers, kept by its client's calls.
// Every call renews it and a call in flight holds it; it lapses once no call
// is in flight and the last one ended more than the lease ago. A detached
// job's never lapses. (An ended attached job may still hold its workers -
// FINISHED, for a last save: its lease frees them too.)
//
// Thread-safety: every method may be called from any thread; its own mutex,
// apart from the job's.
#ifndef BATON_CONTROLLER_LEASE_H_
#define BATON_CONTROLLER_LEASE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace baton {

class Lease {
 public:
  // `length`: the job's lease_ms; `held`: false for a detached job.
  Lease(absl::Duration length, bool held) : length_(length), held_(held), last_call_(absl::Now()) {}

  void BeginCall(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++calls_in_flight_;
    last_call_ = now;
  }
  void EndCall(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --calls_in_flight_;
    last_call_ = now;
  }
  bool Lapsed(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_) {
    if (!held_) return false;
    absl::MutexLock lock(&mu_);
    return calls_in_flight_ == 0 && now - last_call_ > length_;
  }

 private:
  const absl::Duration length_;
  const bool held_;
  mutable absl::Mutex mu_;
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_call_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_LEASE_H_
