#include "worker/step_thread.h"

#include <pthread.h>

#include <utility>

namespace baton {

StepThread::StepThread()
    : thread_([this] {
        // Named apart from gRPC's pool it was started from (perf, top).
        pthread_setname_np(pthread_self(), "baton-step");
        Loop();
      }) {}

StepThread::~StepThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StepThread::Run(absl::FunctionRef<void()> fn) {
  absl::MutexLock lock(&mu_);
  // One call at a time: wait for the slot, hand `fn` over, wait until the
  // thread has returned from it; the slot is free again once this caller
  // has taken its outcome.
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == nullptr; };
  mu_.Await(absl::Condition(&free));
  pending_ = &fn;
  mu_.Await(absl::Condition(&done_));
  std::exception_ptr thrown = std::exchange(thrown_, nullptr);
  done_ = false;
  pending_ = nullptr;
  if (thrown != nullptr) std::rethrow_exception(thrown);
}

void StepThread::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return (pending_ != nullptr && !done_) || stopping_; };
    mu_.Await(absl::Condition(&ready));
    if (pending_ == nullptr || done_) return;  // stopping, nothing handed over
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
  }
}

}  // namespace baton
