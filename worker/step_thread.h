// StepThread: one long-lived thread that runs a mesh's steps, one call after
// another, for whichever RPC thread asked.
//
// gRPC's synchronous server runs each call on whichever of its pool's
// threads polled it, and grows and shrinks that pool as calls block: with
// one step per RunStep, a worker's steps ran on a dozen threads over a job,
// several of them created for it, each with cold caches and its own malloc
// arena and OpenMP state. A job's compute on one thread costs the same
// whether the controller asks for one step per call or for many
// (docs/threading.md, "Step thread").
//
// Run() blocks its caller until the function has run (an exception it
// throws is rethrown to the caller); callers are served in turn. Between
// them the thread may serve a Source: file descriptors it waits on
// (poll(2)) and what it does when one is ready - a mesh's step channel
// (worker/step_channel.h), whose calls then reach the step thread with no
// hand-over from another thread. The destructor joins the thread: never
// destroy a StepThread from a function it runs.
//
// Whoever waits for the step thread (Run) must not hold a lock that a
// Source's work takes: the step thread takes it while the caller waits.
#ifndef BATON_WORKER_STEP_THREAD_H_
#define BATON_WORKER_STEP_THREAD_H_

#include <exception>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace baton {

class StepThread {
 public:
  // Work the thread takes up between Runs; its methods run on the thread.
  class Source {
   public:
    virtual ~Source() = default;
    // What to wait on next (each for POLLIN); asked before every wait.
    virtual std::vector<int> fds() = 0;
    // `fd` is ready: `revents` as poll(2) set them.
    virtual void Ready(int fd, short revents) = 0;
  };

  StepThread();
  ~StepThread();
  StepThread(const StepThread&) = delete;
  StepThread& operator=(const StepThread&) = delete;

  // Runs `fn` on the thread; returns once it has returned.
  void Run(absl::FunctionRef<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // From now on the thread serves `source` between Runs (nullptr: none).
  // It must outlive the thread: a member declared before the StepThread.
  void Serve(Source* source) ABSL_LOCKS_EXCLUDED(mu_);

  // The thread's id (for tests and logs).
  std::thread::id id() const { return thread_.get_id(); }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes the thread from its wait (a Run, a Serve, the destructor).
  void Wake();

  absl::Mutex mu_;
  const absl::FunctionRef<void()>* pending_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = false;          // the thread returned from *pending_
  std::exception_ptr thrown_ ABSL_GUARDED_BY(mu_);  // by the last call
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Source* source_ ABSL_GUARDED_BY(mu_) = nullptr;
  const int wake_fd_;  // an eventfd
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_STEP_THREAD_H_
