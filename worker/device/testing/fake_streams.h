// Streams and events for tests on a CPU: each stream is a queue of work,
// event records and event waits that nothing runs until the test says which
// stream goes next (RunUntilIdle with a preference). A wait whose event has
// not been recorded yet holds its stream, as on a GPU; running the streams in
// an adversarial order shows whether the ordering code put the waits where
// they belong (a missing one lets a consumer read a buffer before its
// producer wrote it).
//
// Time is simulated as a GPU keeps it: each stream has a clock that its work
// advances by the work's cost and a wait moves to the awaited event's time;
// an event takes its stream's time when recorded, so MsSince gives what CUDA
// events would.
#ifndef BATON_WORKER_DEVICE_TESTING_FAKE_STREAMS_H_
#define BATON_WORKER_DEVICE_TESTING_FAKE_STREAMS_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/device/streams.h"

namespace baton::testing {

class FakeEvent : public StreamEvent {
 public:
  bool Done() const override { return done_.load(); }
  double MsSince(const StreamEvent& earlier) const override {
    const auto& e = static_cast<const FakeEvent&>(earlier);
    return Done() && e.Done() ? time_ms_ - e.time_ms_ : -1;
  }
  void Complete(double time_ms = 0) {
    time_ms_ = time_ms;
    done_.store(true);
  }
  double time_ms() const { return time_ms_; }

 private:
  std::atomic<bool> done_{false};
  double time_ms_ = 0;
};

class FakeStream : public Stream {
 public:
  explicit FakeStream(std::string name) : name_(std::move(name)) {}

  std::shared_ptr<StreamEvent> Record() override {
    auto event = std::make_shared<FakeEvent>();
    ops_.push_back(Op{nullptr, event, nullptr, "record", 0});
    return event;
  }
  void Wait(const StreamEvent& event) override {
    ops_.push_back(Op{nullptr, nullptr, static_cast<const FakeEvent*>(&event), "wait", 0});
  }
  // Kernels: run when the stream reaches them, taking `cost_ms` of its time.
  void Enqueue(std::string what, std::function<void()> work, double cost_ms = 0) {
    ops_.push_back(Op{std::move(work), nullptr, nullptr, std::move(what), cost_ms});
  }

  // Runs the next operation if it can (a wait on an event not yet done
  // cannot); false when it could not or nothing is queued.
  bool Step(std::vector<std::string>* log) {
    if (ops_.empty()) return false;
    Op& op = ops_.front();
    if (op.wait != nullptr && !op.wait->Done()) return false;
    if (op.wait != nullptr) now_ms_ = std::max(now_ms_, op.wait->time_ms());
    if (op.work) op.work();
    now_ms_ += op.cost_ms;
    if (op.record) op.record->Complete(now_ms_);
    if (log) log->push_back(name_ + ": " + op.what);
    ops_.pop_front();
    return true;
  }
  size_t queued() const { return ops_.size(); }
  const std::string& name() const { return name_; }

 private:
  struct Op {
    std::function<void()> work;
    std::shared_ptr<FakeEvent> record;
    const FakeEvent* wait;
    std::string what;
    double cost_ms;
  };
  const std::string name_;
  double now_ms_ = 0;
  std::deque<Op> ops_;
};

// Runs the streams until none can go on, always the first of `preference`
// that can: the order a GPU may pick when nothing forbids it. Returns false if
// work is left that can never run (a wait on an event never recorded).
inline bool RunUntilIdle(const std::vector<FakeStream*>& preference, std::vector<std::string>* log = nullptr) {
  for (;;) {
    bool ran = false;
    for (FakeStream* s : preference) {
      if (s->Step(log)) {
        ran = true;
        break;
      }
    }
    if (!ran) break;
  }
  for (FakeStream* s : preference) {
    if (s->queued() > 0) return false;
  }
  return true;
}

}  // namespace baton::testing

#endif  // BATON_WORKER_DEVICE_TESTING_FAKE_STREAMS_H_
