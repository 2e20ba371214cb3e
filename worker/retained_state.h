// RetainedStates: the job state a worker keeps after the mesh it ran on is
// dropped, so that recovery and rescale can move it worker to worker
// instead of through a checkpoint on disk (TorchFT heals a replica from a
// live peer the same way).
//
// When a mesh holding a loaded job is aborted or replaced, the worker takes
// the job's ShardStore once the mesh's last step has returned (its
// communicators aborted, that is at once) and keeps it here at the step its
// optimizer last completed - a step commits all-or-none: a rank that failed
// before OPTIMIZER_STEP keeps the previous step's state untouched.
//
//   mesh dropped ─> Begin ─(last step returned)─> Keep(job, store, step) ─┐
//        held: Get / Read serve it ─> Release, a newer copy of the job,   │
//        an Abort that drops the job's state, or kMaxAge ─> gone <────────┘
//
// Thread-safety: every method may be called from any thread; a kept store
// is never written again, so reads of it need no lock beyond finding it.
#ifndef BATON_WORKER_RETAINED_STATE_H_
#define BATON_WORKER_RETAINED_STATE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "worker/caching_allocator.h"
#include "worker/shard_store.h"

namespace baton {

class RetainedStates {
 public:
  // A kept state nobody released is dropped after this long.
  static constexpr absl::Duration kMaxAge = absl::Minutes(15);
  // The figures of this many of a mesh's last steps are kept with its job's
  // state: a controller that lost a call's answer (it restarted, the call
  // failed) records those steps from them instead of running them again.
  static constexpr size_t kRecentSteps = 512;

  struct Held {
    // First, so last to go: the store's blocks are cached while it is kept.
    CacheUser cache_user;
    int step = 0;
    int64_t bytes = 0;
    std::unique_ptr<const ShardStore> store;
    absl::Time since;
    // This rank's figures of the steps it ran last on the dropped mesh, up
    // to `step`, oldest first.
    std::vector<baton::v1::StepMetrics> recent;
  };

  // A mesh is being dropped: a copy may follow. Get waits for every begun
  // one to end.
  void Begin();
  // Ends a Begin: keeps `store` at `step` for `job_id` with the figures of
  // its last steps (replacing an older copy of that job), or keeps nothing
  // when `store` is null.
  void Keep(const std::string& job_id, std::unique_ptr<ShardStore> store, int step,
            std::vector<baton::v1::StepMetrics> recent = {});

  // The copy of `job_id`, after waiting up to `wait` for copies still being
  // taken; nullptr when none is held.
  std::shared_ptr<const Held> Get(const std::string& job_id, absl::Duration wait);
  // Drops the copy of `job_id` ("" = all); the bytes released.
  int64_t Release(const std::string& job_id);

 private:
  // Moves the states past kMaxAge into `expired`, to be freed outside the lock.
  void ExpireLocked(std::vector<std::shared_ptr<const Held>>* expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  int taking_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<const Held>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_RETAINED_STATE_H_
