#include "worker/comm/stream_handle.h"

#include <thread>
#include <utility>

namespace baton {

StreamHandle::StreamHandle(std::string op, std::shared_ptr<Stream> compute, Issued issued,
                           std::shared_ptr<EventWatch> watch, std::function<void()> finish,
                           EventWatch::Clock::time_point deadline, std::shared_ptr<CommClock> clock)
    : op_(std::move(op)),
      compute_(std::move(compute)),
      begin_(std::move(issued.begin)),
      done_(std::move(issued.done)),
      watch_(std::move(watch)),
      finish_(std::move(finish)),
      deadline_(deadline),
      clock_(std::move(clock)) {}

void StreamHandle::Ordered() {
  if (ordered_) return;
  ordered_ = true;
  std::shared_ptr<StreamEvent> before = compute_->Record();
  compute_->Wait(*done_);
  std::shared_ptr<StreamEvent> after = compute_->Record();
  if (finish_) finish_();
  // Counted once both ends have run, on the device's clock; where it keeps
  // none (fake streams), as in flight until now and not waited on by the
  // host.
  watch_->Add(op_ + ", waited on", after, deadline_,
              [clock = clock_, begin = begin_, done = done_, before, after, issued = issued_] {
                const double in_flight = done->MsSince(*begin), waited = after->MsSince(*before);
                if (in_flight >= 0 && waited >= 0) {
                  clock->AddMs(in_flight, waited);
                } else {
                  const auto now = std::chrono::steady_clock::now();
                  clock->Count(issued, now, now, now);
                }
              });
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
