// StepChannels: the controller's ends of a mesh's step channels
// (docs/control_plane.md, "Step channel"), one TCP connection per rank (TLS
// in a fleet with mutual TLS), opened once the mesh is configured (the
// ports and one-time secrets come in the ranks' ConfigureResponses) and
// closed with the mesh. A job's RunStep calls go over them instead of gRPC:
// a request frame to every rank, one reply frame back from each, in order,
// so a call sent ahead of the one running is answered after it. No gRPC
// completion queue, thread pool or HTTP/2 framing on either side: on a
// 2-core machine that is what a step per call cost beyond the step
// (bench/dispatch).
//
// A call is waited for as the dispatcher waits for a fan-out
// (PendingFanOut::Wait): a deadline, `should_abort` polled every
// Dispatcher::kAbortPollInterval, and on the first failure the failure grace (the
// mesh aborted everywhere, dead ranks not waited for, the others given the
// grace's time to return). A failed, cancelled or abandoned call breaks the
// channels (replies may be left in them): they are shut down, the workers
// see the end of the stream, and no call uses them again.
//
// Not thread-safe: one job runner makes, waits for and destroys the calls
// of a mesh, in order.
#ifndef BATON_CONTROLLER_STEP_CHANNELS_H_
#define BATON_CONTROLLER_STEP_CHANNELS_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/frame_conn.h"
#include "common/security.h"
#include "controller/dispatcher.h"
#include "proto/mesh.pb.h"
#include "proto/worker.pb.h"

namespace baton {

class StepChannels : public std::enable_shared_from_this<StepChannels> {
 public:
  static constexpr absl::Duration kConnectTimeout = absl::Seconds(2);

  // Connects to every rank of `mesh` at its address's host and the port in
  // `answers[rank]` (inside TLS when `tls` has the fleet's certificates:
  // common/frame_conn.h), says hello with the rank's secret and waits for
  // its answer. An error when a rank offered none, could not be reached or
  // refused: the mesh's steps then go over gRPC.
  static absl::StatusOr<std::shared_ptr<StepChannels>> Open(
      const baton::v1::Mesh& mesh, const std::vector<baton::v1::ConfigureResponse>& answers, const Credentials& tls);

  class Call;
  // Sends `request` to every rank now; `deadline` from now.
  std::unique_ptr<Call> Start(const baton::v1::RunStepRequest& request, absl::Duration deadline);

  // Whether a call broke them (see above): no call may use them any more.
  bool broken() const { return broken_.load(); }

 private:
  explicit StepChannels(std::vector<std::unique_ptr<FrameConn>> ranks) : ranks_(std::move(ranks)) {}
  // Shuts every connection down (the workers see the end of the stream).
  void Break();

  const std::vector<std::unique_ptr<FrameConn>> ranks_;
  std::atomic<bool> broken_{false};
};

// One call on every rank, put on the wire by StepChannels::Start.
class StepChannels::Call {
 public:
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Waits for every rank's reply, as PendingFanOut::Wait does; once.
  std::vector<CallResult<baton::v1::RunStepResponse>> Wait(const FanOut& options, std::string* abort_reason = nullptr);

 private:
  friend class StepChannels;
  Call(std::shared_ptr<StepChannels> channels, absl::Duration deadline);
  // Reads rank `r`'s reply into its result.
  void Read(size_t r);

  const std::shared_ptr<StepChannels> channels_;
  const absl::Time start_;
  const absl::Time end_;
  std::vector<CallResult<baton::v1::RunStepResponse>> results_;
  std::vector<bool> done_;
  bool failed_ = false;
  bool waited_ = false;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_STEP_CHANNELS_H_
