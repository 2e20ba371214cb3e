// How a worker on a GPU orders its collectives against its compute without
// stopping the host: compute runs on one stream, a communicator's
// collectives on a stream of its own, and the two meet only at events.
//
//   issue:   ready = compute.Record(); comm.Wait(ready); <collective on comm>;
//            done = comm.Record()
//            (a reduce-scatter starts after the backward that made its input,
//            an all-gather after the copy of the shard it sends)
//   consume: compute.Wait(done)
//            (a gather's consumer - the unit's forward - runs after it)
//
// Nothing here blocks the host but EventWatch::Drain, which a step calls once
// at its end, where its loss is read anyway. A collective that outlives its
// deadline is found by the watch's own thread, which aborts the
// communicator: its kernels end, the step fails, nothing waits forever.
//
// Interfaces, not CUDA: worker/device/cuda_streams.h fills them in with CUDA
// streams and events, worker/device/testing/fake_streams.h with queues a test
// runs in an order of its choosing (worker/device/streams_test.cc).
#ifndef BATON_WORKER_DEVICE_STREAMS_H_
#define BATON_WORKER_DEVICE_STREAMS_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace baton {

// A point in one stream's work: done once everything enqueued on that stream
// before it was recorded has run.
class StreamEvent {
 public:
  virtual ~StreamEvent() = default;
  // Whether the work before it has run (never blocks).
  virtual bool Done() const = 0;
  // Milliseconds between `earlier` and this event, both done (the device's
  // clock); -1 where the backend keeps no time.
  virtual double MsSince(const StreamEvent& earlier) const { return -1; }
};

class Stream {
 public:
  virtual ~Stream() = default;
  // Marks everything enqueued on this stream so far.
  virtual std::shared_ptr<StreamEvent> Record() = 0;
  // Work enqueued on this stream from now on starts after `event`; the host
  // does not wait.
  virtual void Wait(const StreamEvent& event) = 0;
};

// Enqueues `collective` on `comm` after everything `compute` has enqueued so
// far; returns the events that mark the collective's start and its end.
struct Issued {
  std::shared_ptr<StreamEvent> begin, done;
};
Issued IssueAfter(Stream& compute, Stream& comm, const std::function<void()>& collective);

// Watches the events of collectives in flight against their deadlines, on a
// thread of its own. The first one past its deadline calls `on_timeout` with
// a sentence saying which (the owner aborts its communicator); Drain then
// returns that failure at once. Thread-safe.
class EventWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_timeout` runs on the watch's thread, once.
  explicit EventWatch(std::function<void(const std::string& why)> on_timeout,
                      std::chrono::milliseconds poll = std::chrono::milliseconds(1));
  ~EventWatch();
  EventWatch(const EventWatch&) = delete;
  EventWatch& operator=(const EventWatch&) = delete;

  // `on_done`, if any, runs on the watch's thread once `event` is done,
  // before a Drain can return (to read the events' times).
  void Add(std::string what, std::shared_ptr<StreamEvent> event, Clock::time_point deadline,
           std::function<void()> on_done = nullptr);
  // Blocks until every watched event is done (OK), or one timed out or the
  // watch was failed (that status), or `timeout` passed (DEADLINE_EXCEEDED).
  absl::Status Drain(std::chrono::milliseconds timeout);
  // Ends the watch's waits with `status` (an abort); later Drains return it.
  void Fail(absl::Status status);
  // OK while nothing failed.
  absl::Status status() const;
  size_t pending() const;

 private:
  struct Watched {
    std::string what;
    std::shared_ptr<StreamEvent> event;
    Clock::time_point deadline;
    std::function<void()> on_done;
  };
  void Run();

  const std::function<void(const std::string&)> on_timeout_;
  const std::chrono::milliseconds poll_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Watched> watched_;
  absl::Status status_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_DEVICE_STREAMS_H_
