// The handle of a collective that runs on a device stream
// (worker/device/streams.h): Wait() orders the caller's compute stream after
// the collective and returns without blocking the host (then enqueues what
// the operation does after it, AVG's division, on that stream); WaitAside(),
// for a thread that does not compute (a send's reaper), polls the
// collective's end on the host until its deadline. A collective past its
// deadline is found by the communicator's EventWatch, which aborts it; every
// handle then returns that failure.
#ifndef BATON_WORKER_COMM_STREAM_HANDLE_H_
#define BATON_WORKER_COMM_STREAM_HANDLE_H_

#include <functional>
#include <memory>
#include <string>

#include "worker/comm/communicator.h"
#include "worker/device/streams.h"

namespace baton {

class StreamHandle : public CommHandle {
 public:
  StreamHandle(std::string op, std::shared_ptr<Stream> compute, std::shared_ptr<StreamEvent> done,
               std::shared_ptr<EventWatch> watch, std::function<void()> finish, EventWatch::Clock::time_point deadline,
               std::shared_ptr<CommClock> clock);

  absl::Status Wait() override;
  absl::Status WaitAside() override;

 private:
  void Ordered();  // the compute stream waits (once), then `finish_`

  const std::string op_;
  std::shared_ptr<Stream> compute_;
  std::shared_ptr<StreamEvent> done_;
  std::shared_ptr<EventWatch> watch_;
  std::function<void()> finish_;
  const EventWatch::Clock::time_point deadline_;
  std::shared_ptr<CommClock> clock_;
  const CommClock::Time issued_ = std::chrono::steady_clock::now();
  bool ordered_ = false;
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_STREAM_HANDLE_H_
