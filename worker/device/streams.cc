#include "worker/device/streams.h"

#include <algorithm>
#include <utility>

namespace baton {

Issued IssueAfter(Stream& compute, Stream& comm, const std::function<void()>& collective) {
  std::shared_ptr<StreamEvent> ready = compute.Record();
  comm.Wait(*ready);
  Issued issued;
  issued.begin = comm.Record();
  collective();
  issued.done = comm.Record();
  return issued;
}

EventWatch::EventWatch(std::function<void(const std::string& why)> on_timeout, std::chrono::milliseconds poll)
    : on_timeout_(std::move(on_timeout)), poll_(poll), thread_([this] { Run(); }) {}

EventWatch::~EventWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void EventWatch::Add(std::string what, std::shared_ptr<StreamEvent> event, Clock::time_point deadline,
                     std::function<void()> on_done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.push_back(Watched{std::move(what), std::move(event), deadline, std::move(on_done)});
  }
  changed_.notify_all();
}

void EventWatch::Fail(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  changed_.notify_all();
}

absl::Status EventWatch::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

size_t EventWatch::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return watched_.size();
}

absl::Status EventWatch::Drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ended = changed_.wait_for(lock, timeout, [&] { return !status_.ok() || watched_.empty(); });
  if (!status_.ok()) return status_;
  if (!ended) {
    return absl::DeadlineExceededError(
        std::to_string(watched_.size()) + " collective(s) still in flight after " + std::to_string(timeout.count()) +
        " ms, the first: " + watched_.front().what);
  }
  return absl::OkStatus();
}

void EventWatch::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Drop what is done; the first one past its deadline fails the watch.
    const Clock::time_point now = Clock::now();
    std::string late;
    watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                  [&](const Watched& w) {
                                    if (w.event->Done()) {
                                      if (w.on_done) w.on_done();
                                      return true;
                                    }
                                    if (late.empty() && now > w.deadline) late = w.what;
                                    return false;
                                  }),
                   watched_.end());
    if (!late.empty() && status_.ok()) {
      status_ = absl::DeadlineExceededError(late + " did not complete by its deadline; the communicator is aborted");
      watched_.clear();
      changed_.notify_all();
      lock.unlock();
      on_timeout_(late);
      lock.lock();
      continue;
    }
    changed_.notify_all();
    if (watched_.empty()) {
      changed_.wait(lock, [&] { return stop_ || !watched_.empty(); });
    } else {
      changed_.wait_for(lock, poll_);
    }
  }
}

}  // namespace baton
