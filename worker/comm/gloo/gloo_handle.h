// How a gloo operation is waited for: a handle over a c10d Work that waits in
// short slices (an abort ends the wait), reports when the operation completed,
// and marks the whole group broken when it fails; and the sends and receives in
// flight, which only an abort wakes.
#ifndef BATON_WORKER_COMM_GLOO_GLOO_HANDLE_H_
#define BATON_WORKER_COMM_GLOO_GLOO_HANDLE_H_

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"

namespace baton {

// Failure of one operation breaks the whole group (a peer is gone or out of
// step); the flag is shared with handles that may outlive the communicator.
using BrokenFlag = std::shared_ptr<std::atomic<bool>>;

// A gloo exception as a Status: DEADLINE_EXCEEDED for a timeout, else
// UNAVAILABLE (a peer is gone).
absl::Status FromException(const std::string& op, const std::exception& e);

// The point-to-point operations in flight, which Abort wakes: c10d's gloo
// send and receive wait on a buffer that only abort() (or their timeout,
// which breaks the whole gloo context) ends. Collectives need no entry: their
// handles wait in short slices and look at the abort signal in between.
//
// An aborted (or failed) send or receive stays queued inside gloo's pair,
// which keeps only a weak pointer to its buffer: freed, a late message for it
// would end the worker. Such operations are kept here until the process
// group is gone (~GlooCommunicator).
class InFlight {
 public:
  void Add(const void* handle, c10::intrusive_ptr<c10d::Work> work, const AbortSignal& signal) {
    absl::MutexLock lock(&mu_);
    works_[handle] = work;
    if (signal.raised()) AbortQuietly(*work);  // raised before it was listed
  }
  void Remove(const void* handle) {
    absl::MutexLock lock(&mu_);
    works_.erase(handle);
  }
  void AbortAll() {
    absl::MutexLock lock(&mu_);
    for (auto& [handle, work] : works_) AbortQuietly(*work);
  }
  void Bury(c10::intrusive_ptr<c10d::Work> work) {
    absl::MutexLock lock(&mu_);
    buried_.push_back(std::move(work));
  }
  void ClearBuried() {
    std::vector<c10::intrusive_ptr<c10d::Work>> buried;
    {
      absl::MutexLock lock(&mu_);
      buried.swap(buried_);
    }
  }

 private:
  static void AbortQuietly(c10d::Work& work) {
    try {
      work.abort();
    } catch (const std::exception&) {
      // Nothing to wake.
    }
  }
  absl::Mutex mu_;
  std::map<const void*, c10::intrusive_ptr<c10d::Work>> works_ ABSL_GUARDED_BY(mu_);
  std::vector<c10::intrusive_ptr<c10d::Work>> buried_ ABSL_GUARDED_BY(mu_);
};

class GlooHandle : public CommHandle {
 public:
  // How often a collective's wait looks at the abort signal.
  static constexpr Milliseconds kSlice{50};

  // `in_flight` is set for sends and receives (see InFlight).
  GlooHandle(std::string op, c10::intrusive_ptr<c10d::Work> work, Milliseconds timeout,
             std::function<void()> finish, BrokenFlag broken, std::shared_ptr<AbortSignal> abort,
             std::shared_ptr<InFlight> in_flight, std::shared_ptr<CommClock> clock)
      : op_(std::move(op)),
        work_(std::move(work)),
        timeout_(timeout),
        finish_(std::move(finish)),
        broken_(std::move(broken)),
        abort_(std::move(abort)),
        in_flight_(std::move(in_flight)),
        clock_(std::move(clock)) {
    if (in_flight_) in_flight_->Add(this, work_, *abort_);
    // The moment a collective completes, told by its future on gloo's
    // thread (sends and receives have none: the end of their wait stands).
    if (!in_flight_) {
      try {
        work_->getFuture()->addCallback([completed = completed_](c10::ivalue::Future&) {
          completed->store(std::chrono::steady_clock::now().time_since_epoch().count());
        });
      } catch (const std::exception&) {
      }
    }
  }
  ~GlooHandle() override {
    if (!in_flight_) return;
    in_flight_->Remove(this);
    if (work_) in_flight_->Bury(std::move(work_));  // never waited: may still be queued
  }

  absl::Status WaitAside() override {
    aside_ = true;
    return Wait();
  }

  absl::Status Wait() override {
    if (done_) return status_;
    done_ = true;
    const auto began = std::chrono::steady_clock::now();
    status_ = in_flight_ ? WaitPointToPoint() : WaitCollective();
    const auto ended = std::chrono::steady_clock::now();
    const int64_t completed = completed_->load();
    clock_->Count(issued_, completed > 0 ? CommClock::Time(CommClock::Time::duration(completed)) : ended,
                  aside_ ? ended : began, ended);
    if (status_.ok() && finish_) {
      try {
        finish_();
      } catch (const std::exception& e) {
        status_ = FromException(op_, e);
      }
    }
    if (!status_.ok()) broken_->store(true);
    if (in_flight_) {
      in_flight_->Remove(this);
      if (!status_.ok()) in_flight_->Bury(std::move(work_));
    }
    work_.reset();
    finish_ = nullptr;
    return status_;
  }

 private:
  absl::Status WaitPointToPoint() {
    try {
      // The wait bounds a send or receive (c10d's gloo has no per-op
      // timeout for them); false means it was aborted.
      if (work_->wait(timeout_ + Milliseconds(1000))) return absl::OkStatus();
      return abort_->raised() ? abort_->status("gloo " + op_)
                              : absl::DeadlineExceededError(absl::StrCat("gloo ", op_, " timed out"));
    } catch (const std::exception& e) {
      return abort_->raised() ? abort_->status("gloo " + op_) : FromException(op_, e);
    }
  }

  absl::Status WaitCollective() {
    // gloo enforces `timeout_` itself; the extra second only guards against
    // a wait that would otherwise outlive it. A slice that elapses throws
    // without touching the operation, which goes on.
    const auto deadline = std::chrono::steady_clock::now() + timeout_ + Milliseconds(1000);
    while (true) {
      if (abort_->raised()) return abort_->status("gloo " + op_);
      try {
        work_->wait(kSlice);
        return absl::OkStatus();
      } catch (const std::exception& e) {
        if (work_->isCompleted()) {
          try {
            work_->wait(kSlice);  // completed: returns, or throws the operation's own error
            return absl::OkStatus();
          } catch (const std::exception& failed) {
            // An operation that an abort ended (shared memory's) fails as
            // the abort.
            return abort_->raised() ? abort_->status("gloo " + op_) : FromException(op_, failed);
          }
        }
        if (std::chrono::steady_clock::now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat("gloo ", op_, " timed out"));
        }
      }
    }
  }

  std::string op_;
  c10::intrusive_ptr<c10d::Work> work_;
  Milliseconds timeout_;
  std::function<void()> finish_;
  BrokenFlag broken_;
  std::shared_ptr<AbortSignal> abort_;
  std::shared_ptr<InFlight> in_flight_;
  std::shared_ptr<CommClock> clock_;
  const CommClock::Time issued_ = std::chrono::steady_clock::now();
  std::shared_ptr<std::atomic<int64_t>> completed_ = std::make_shared<std::atomic<int64_t>>(0);
  bool done_ = false;
  bool aside_ = false;  // WaitAside: not the computing thread's wait
  absl::Status status_;
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_GLOO_GLOO_HANDLE_H_
