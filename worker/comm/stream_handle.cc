#include "worker/comm/stream_handle.h"

#include <thread>
#include <utility>

namespace baton {

StreamHandle::StreamHandle(std::string op, std::shared_ptr<Stream> compute, std::shared_ptr<StreamEvent> done,
                           std::shared_ptr<EventWatch> watch, std::function<void()> finish,
                           EventWatch::Clock::time_point deadline, std::shared_ptr<CommClock> clock)
    : op_(std::move(op)),
      compute_(std::move(compute)),
      done_(std::move(done)),
      watch_(std::move(watch)),
      finish_(std::move(finish)),
      deadline_(deadline),
      clock_(std::move(clock)) {}

void StreamHandle::Ordered() {
  if (ordered_) return;
  ordered_ = true;
  compute_->Wait(*done_);
  if (finish_) finish_();
  // The host did not wait: nothing of it is exposed communication.
  const auto now = std::chrono::steady_clock::now();
  clock_->Count(issued_, now, now, now);
}

absl::Status StreamHandle::Wait() {
  if (absl::Status s = watch_->status(); !s.ok()) return s;
  Ordered();
  return absl::OkStatus();
}

absl::Status StreamHandle::WaitAside() {
  while (!done_->Done()) {
    if (absl::Status s = watch_->status(); !s.ok()) return s;
    if (EventWatch::Clock::now() > deadline_) {
      return absl::DeadlineExceededError(op_ + " did not complete by its deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (absl::Status s = watch_->status(); !s.ok()) return s;
  Ordered();
  return absl::OkStatus();
}

}  // namespace baton
