#include "worker/send_reaper.h"

#include <utility>

namespace baton {

SendReaper::SendReaper() : thread_([this] { Run(); }) {}

SendReaper::~SendReaper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SendReaper::Add(std::unique_ptr<CommHandle> handle, at::Tensor tensor) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Sending{std::move(handle), std::move(tensor)});
}

bool SendReaper::Pending() const {
  absl::MutexLock lock(&mu_);
  return !queue_.empty() || busy_;
}

absl::Status SendReaper::Flush() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
  mu_.Await(absl::Condition(&drained));
  absl::Status first = std::move(first_error_);
  first_error_ = absl::OkStatus();
  return first;
}

void SendReaper::Run() {
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  while (true) {
    Sending sending;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_work));
      if (queue_.empty()) return;  // stopping, nothing left
      sending = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    // Bounded: a send's wait ends with its timeout or the mesh's abort.
    // Waited here, not by the computing thread: in flight, not exposed
    // (what the computing thread blocks on is its Flush, counted there).
    absl::Status status = sending.handle->WaitAside();
    sending = Sending{};  // the tensor goes here, outside the lock
    absl::MutexLock lock(&mu_);
    if (first_error_.ok() && !status.ok()) first_error_ = std::move(status);
    busy_ = false;
  }
}

}  // namespace baton
