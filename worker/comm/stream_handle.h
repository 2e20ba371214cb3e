// The handle of a collective that runs on a device stream
// (worker/device/streams.h): Wait() orders the caller's compute stream after
// the collective and returns without blocking the host (then enqueues what
// the operation does after it, AVG's division, on that stream); WaitAside(),
// for a thread that does not compute (a send's reaper), polls the
// collective's end on the host until its deadline. A collective past its
// deadline is found by the communicator's EventWatch, which aborts it; every
// handle then returns that failure.
//
// Its times come from the device's events, once they have run: in flight
// from the collective's start to its end on the comm stream; exposed (what
// the computing stream stalled on it) from an event recorded on the compute
// stream just before its wait to one just after.
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
  StreamHandle(std::string op, std::shared_ptr<Stream> compute, Issued issued, std::shared_ptr<EventWatch> watch,
               std::function<void()> finish, EventWatch::Clock::time_point deadline, std::shared_ptr<CommClock> clock);

  absl::Status Wait() override;
  absl::Status WaitAside() override;

 private:
  void Ordered();  // the compute stream waits (once), then `finish_`

  const std::string op_;
  std::shared_ptr<Stream> compute_;
  std::shared_ptr<StreamEvent> begin_, done_;
  std::shared_ptr<EventWatch> watch_;
  std::function<void()> finish_;
  const EventWatch::Clock::time_point deadline_;
  std::shared_ptr<CommClock> clock_;
  const CommClock::Time issued_ = std::chrono::steady_clock::now();
  bool ordered_ = false;
};

}  // namespace baton

#endif  // BATON_WORKER_COMM_STREAM_HANDLE_H_
