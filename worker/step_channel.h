// StepChannelServer: the worker's end of a mesh's step channel
// (docs/control_plane.md, "Step channel"). A listening TCP socket made with
// the mesh, offered to the controller in ConfigureResponse with a one-time
// secret; it takes one connection whose first frame is a StepChannelHello
// with that epoch and secret, answers it, stops listening, and from then on
// every frame is a RunStepRequest handed to the handler and answered with a
// StepChannelReply, in order.
//
// In a fleet with mutual TLS the connection is TLS (common/frame_conn.h):
// the controller's certificate is checked before its hello is read.
//
// It is a StepThread::Source: everything above runs on the mesh's step
// thread, so a call the controller sent ahead is in the socket when the
// step before it ends and is read without waking another thread. A frame
// is read whole within kStepFrameTimeout once its first byte is there. A
// connection whose handshake or hello fails is closed and the worker goes on
// listening; once attached, a frame that is not a RunStepRequest is
// answered INVALID_ARGUMENT, and a controller that hangs up (or a frame that
// does not arrive whole) ends the channel: the controller does not
// reconnect.
#ifndef BATON_WORKER_STEP_CHANNEL_H_
#define BATON_WORKER_STEP_CHANNEL_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/frame_conn.h"
#include "common/security.h"
#include "common/tcp.h"
#include "proto/worker.pb.h"
#include "worker/step_thread.h"

namespace baton {

class StepChannelServer : public StepThread::Source {
 public:
  // Runs a call's steps into `reply`; `hung_up` says whether the
  // controller has closed the channel meanwhile (a call of many steps
  // stops between them, as a cancelled gRPC call does).
  using Handler = std::function<void(const baton::v1::RunStepRequest& request,
                                     const std::function<bool()>& hung_up, baton::v1::StepChannelReply* reply)>;

  static constexpr absl::Duration kHelloTimeout = absl::Seconds(2);
  static constexpr size_t kSecretBytes = 32;

  // Listens on `host` for mesh `epoch`'s controller; over TLS when `tls`
  // has the fleet's certificates (common/frame_conn.h), the controller's
  // certificate then checked before its hello is read.
  static absl::StatusOr<std::unique_ptr<StepChannelServer>> Listen(const std::string& host, int64_t epoch,
                                                                   const Credentials& tls, Handler handler);

  int port() const { return port_; }
  const std::string& secret() const { return secret_; }
  // Whether a controller said hello and is still connected.
  bool attached() const { return attached_.load(); }

  std::vector<int> fds() override;
  void Ready(int fd, short revents) override;

 private:
  StepChannelServer(ScopedFd listener, int port, int64_t epoch, std::string secret,
                    std::shared_ptr<const TlsContext> tls, Handler handler);
  // A connection on the listener: its TLS handshake if any, its hello,
  // answered; true when it is the controller's (then conn_).
  bool Admit(ScopedFd conn);
  // One request from the attached connection, answered; false when the
  // connection is to be dropped.
  bool Answer();
  bool HungUp() const;

  ScopedFd listener_;
  std::unique_ptr<FrameConn> conn_;
  const int port_;
  const int64_t epoch_;
  const std::string secret_;
  const std::shared_ptr<const TlsContext> tls_;  // null: in the clear
  const Handler handler_;
  std::atomic<bool> attached_{false};
};

}  // namespace baton

#endif  // BATON_WORKER_STEP_CHANNEL_H_
