#include "worker/send_reaper.h"

#include <utility>

namespace baton {

SendReaper::SendReaper() : thread_([this] { Run(); }) {}

SendReaper::~SendReaper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void SendReaper::Add(std::unique_ptr<CommHandle> handle, at::Tensor tensor) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Sending{std::move(handle), std::move(tensor)});
  }
  changed_.notify_all();
}

absl::Status SendReaper::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return queue_.empty() && !busy_; });
  absl::Status first = std::move(first_error_);
  first_error_ = absl::OkStatus();
  return first;
}

void SendReaper::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Sending sending = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    // Bounded: a send's wait ends with its timeout or the mesh's abort.
    absl::Status status = sending.handle->Wait();
    sending = Sending{};  // the tensor goes here, outside the lock
    lock.lock();
    if (first_error_.ok() && !status.ok()) first_error_ = std::move(status);
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace baton
