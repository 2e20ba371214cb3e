// Completes a pipeline's sends in the background, in the order they were
// issued, and lets each one's tensor go as soon as its send is done - not at
// the step's end: a pipeline's gradients sent back would otherwise pile up,
// one per microbatch and chunk (an interleaved 1F1B of 16 microbatches held
// ~20 MB more than its plan predicts). The computing thread never blocks on
// a send before the step's end, so no schedule can deadlock on one; gloo
// tells a send's completion only to whoever waits on it, hence a thread.
//
// Thread-safe: Add and Flush from the executor's thread, the waits on the
// reaper's own.
#ifndef BATON_WORKER_SEND_REAPER_H_
#define BATON_WORKER_SEND_REAPER_H_

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"

namespace baton {

class SendReaper {
 public:
  SendReaper();
  ~SendReaper();  // waits out what was added
  SendReaper(const SendReaper&) = delete;
  SendReaper& operator=(const SendReaper&) = delete;

  // A send in flight and the tensor it reads, kept alive until it is done.
  void Add(std::unique_ptr<CommHandle> handle, at::Tensor tensor);
  // Waits until every send added so far is done; the first failure since
  // the last Flush, if any.
  absl::Status Flush();
  // Whether a send is still queued or waited on (Flush would block).
  bool Pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Sending {
    std::unique_ptr<CommHandle> handle;
    at::Tensor tensor;
  };
  void Run();

  // Waiters wake as what they wait for changes under it (absl::Mutex
  // evaluates their conditions when it is released).
  mutable absl::Mutex mu_;
  std::deque<Sending> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a send is being waited on
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;         // last: starts once the rest is set
};

}  // namespace baton

#endif  // BATON_WORKER_SEND_REAPER_H_
