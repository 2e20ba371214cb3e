// Streams and events for tests on a CPU: each stream is a queue of work,
// event records and event waits that nothing runs until the test says which
// stream goes next (RunUntilIdle with a preference). A wait whose event has
// not been recorded yet holds its stream, as on a GPU; running the streams in
// an adversarial order shows whether the ordering code put the waits where
// they belong (a missing one lets a consumer read a buffer before its
// producer wrote it).
#ifndef BATON_WORKER_DEVICE_TESTING_FAKE_STREAMS_H_
#define BATON_WORKER_DEVICE_TESTING_FAKE_STREAMS_H_

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
  void Complete() { done_.store(true); }

 private:
  std::atomic<bool> done_{false};
};

class FakeStream : public Stream {
 public:
  explicit FakeStream(std::string name) : name_(std::move(name)) {}

  std::shared_ptr<StreamEvent> Record() override {
    auto event = std::make_shared<FakeEvent>();
    ops_.push_back(Op{nullptr, event, nullptr, "record"});
    return event;
  }
  void Wait(const StreamEvent& event) override {
    ops_.push_back(Op{nullptr, nullptr, static_cast<const FakeEvent*>(&event), "wait"});
  }
  // Kernels: run when the stream reaches them.
  void Enqueue(std::string what, std::function<void()> work) {
    ops_.push_back(Op{std::move(work), nullptr, nullptr, std::move(what)});
  }

  // Runs the next operation if it can (a wait on an event not yet done
  // cannot); false when it could not or nothing is queued.
  bool Step(std::vector<std::string>* log) {
    if (ops_.empty()) return false;
    Op& op = ops_.front();
    if (op.wait != nullptr && !op.wait->Done()) return false;
    if (op.work) op.work();
    if (op.record) op.record->Complete();
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
  };
  const std::string name_;
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
