#include "worker/step_thread.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

namespace baton {

StepThread::StepThread()
    : wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      thread_([this] {
        // Named apart from gRPC's pool it was started from (perf, top).
        pthread_setname_np(pthread_self(), "baton-step");
        Loop();
      }) {}

StepThread::~StepThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  ::close(wake_fd_);
}

void StepThread::Wake() {
  const uint64_t one = 1;
  // Only fails when the counter is full: the thread is awake anyway.
  [[maybe_unused]] ssize_t written = ::write(wake_fd_, &one, sizeof(one));
}

void StepThread::Run(absl::FunctionRef<void()> fn) {
  absl::MutexLock lock(&mu_);
  // One call at a time: wait for the slot, hand `fn` over, wait until the
  // thread has returned from it; the slot is free again once this caller
  // has taken its outcome.
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == nullptr; };
  mu_.Await(absl::Condition(&free));
  pending_ = &fn;
  Wake();  // after pending_ is set: the thread looks at it before it waits
  mu_.Await(absl::Condition(&done_));
  std::exception_ptr thrown = std::exchange(thrown_, nullptr);
  done_ = false;
  pending_ = nullptr;
  if (thrown != nullptr) std::rethrow_exception(thrown);
}

void StepThread::Serve(Source* source) {
  {
    absl::MutexLock lock(&mu_);
    source_ = source;
  }
  Wake();
}

void StepThread::Loop() {
  std::vector<pollfd> waits;
  mu_.Lock();
  while (true) {
    if (pending_ != nullptr && !done_) {
      const absl::FunctionRef<void()>* fn = pending_;
      std::exception_ptr thrown;
      mu_.Unlock();
      try {
        (*fn)();
      } catch (...) {
        thrown = std::current_exception();
      }
      mu_.Lock();
      thrown_ = thrown;
      done_ = true;
      continue;
    }
    if (stopping_) break;
    Source* source = source_;
    mu_.Unlock();
    // A Run, a Serve or the destructor that comes after the look above
    // writes the eventfd: the wait returns at once.
    waits.assign(1, pollfd{wake_fd_, POLLIN, 0});
    if (source != nullptr) {
      for (int fd : source->fds()) waits.push_back(pollfd{fd, POLLIN, 0});
    }
    if (::poll(waits.data(), waits.size(), -1) > 0) {
      if (waits[0].revents != 0) {
        uint64_t count;
        [[maybe_unused]] ssize_t got = ::read(wake_fd_, &count, sizeof(count));
      }
      for (size_t i = 1; i < waits.size(); ++i) {
        if (waits[i].revents != 0) source->Ready(waits[i].fd, waits[i].revents);
      }
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace baton
