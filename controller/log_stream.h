// LogStream: one server stream of a SequencedLog - Watch (the fleet's
// events) and JobLogs (a job's log). It writes the entries after the
// client's sequence (at most `history` of them), then - when it follows -
// each new one as the log announces it, until the client leaves or the log
// is closed and everything was sent. Holds no thread while it waits; at
// most one write is in flight. Deletes itself when gRPC is done with it.
#ifndef BATON_CONTROLLER_LOG_STREAM_H_
#define BATON_CONTROLLER_LOG_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/sequenced_log.h"

namespace baton {

template <typename Entry>
class LogStream : public grpc::ServerWriteReactor<Entry> {
 public:
  // `owner` keeps the log alive while the stream lives; `streams` counts
  // open streams (decremented when this one is done).
  LogStream(SequencedLog<Entry>* log, std::shared_ptr<void> owner, int64_t after, size_t history, bool follow,
            std::atomic<int>* streams)
      : log_(log), owner_(std::move(owner)), after_(after), follow_(follow), streams_(streams) {
    if (!follow_) end_ = log_->last_sequence();
    for (auto& e : log_->After(after_, absl::ZeroDuration(), history)) pending_.push_back(std::move(e));
    subscription_ = log_->Subscribe([this] { Pump(); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      FinishOnce(grpc::Status::OK);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    Pump();
  }
  void OnCancel() override { FinishOnce(grpc::Status::OK); }
  void OnDone() override {
    log_->Unsubscribe(subscription_);  // no Pump runs after this returns
    if (streams_ != nullptr) streams_->fetch_sub(1);
    delete this;
  }

 private:
  // Starts the next write if none is in flight and there is something new;
  // finishes once there will be nothing more.
  void Pump() {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (pending_.empty()) {
        const bool closed = log_->closed();  // before reading: a closed log has nothing after
        for (auto& e : log_->After(after_)) {
          if (!follow_ && e.sequence() > end_) break;
          pending_.push_back(std::move(e));
        }
        if (pending_.empty()) {
          if (!follow_ || closed) finish = true;
          if (!finish) return;
        }
      }
      if (!finish) {
        current_ = std::move(pending_.front());
        pending_.pop_front();
        after_ = current_.sequence();
        writing_ = true;
      }
    }
    if (finish) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    this->StartWrite(&current_);
  }
  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    this->Finish(status);
  }

  SequencedLog<Entry>* const log_;
  const std::shared_ptr<void> owner_;
  absl::Mutex mu_;
  int64_t after_ ABSL_GUARDED_BY(mu_);
  int64_t end_ = 0;  // without follow: the last entry to send
  const bool follow_;
  std::atomic<int>* const streams_;
  int subscription_ = 0;
  std::deque<Entry> pending_ ABSL_GUARDED_BY(mu_);
  Entry current_;  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A stream refused before it started (no token, too many streams, unknown
// job).
template <typename Entry>
grpc::ServerWriteReactor<Entry>* RefusedStream(const grpc::Status& status) {
  struct Refused : grpc::ServerWriteReactor<Entry> {
    void OnDone() override { delete this; }
  };
  auto* r = new Refused();
  r->Finish(status);
  return r;
}

}  // namespace baton

#endif  // BATON_CONTROLLER_LOG_STREAM_H_
