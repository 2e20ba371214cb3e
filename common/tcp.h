// Plain TCP for the few paths that must not pay gRPC's per-message costs (a
// mesh's step channel: docs/control_plane.md): a file descriptor that closes
// itself, connecting and listening, and length-prefixed frames.
//
// A frame is a 4-byte little-endian length and that many bytes. Every read
// and write is bounded: a socket gets send and receive timeouts
// (SetIoTimeout), and a frame longer than the reader's limit is refused
// before its body is read.
#ifndef BATON_COMMON_TCP_H_
#define BATON_COMMON_TCP_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton {

// Owns a file descriptor (-1: none).
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { reset(); }
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "HOST:PORT" or "[IPv6]:PORT" split in two (the brackets dropped);
// INVALID_ARGUMENT when there is no port.
absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(const std::string& address);

// A TCP connection to `host` (an address or a name) and `port`, made within `timeout`,
// with TCP_NODELAY. The error says why (refused, timed out, unreachable).
absl::StatusOr<ScopedFd> ConnectTcp(const std::string& host, int port, absl::Duration timeout);
// Whether connecting to `host`:`port` was refused (nothing listens there):
// the one error that says a process is gone.
bool IsConnectionRefused(const absl::Status& status);

// A socket listening on `host` (an address or a name), port chosen by the system, and
// that port.
absl::StatusOr<std::pair<ScopedFd, int>> ListenTcp(const std::string& host);
// Takes one pending connection of listening `fd` (TCP_NODELAY set).
absl::StatusOr<ScopedFd> AcceptTcp(int fd);

// Every read and write on `fd` gives up after `timeout` without progress.
void SetIoTimeout(int fd, absl::Duration timeout);

// The most a step channel's frame may take, either way, once its first
// byte is there (both ends: worker/step_channel.h, controller/step_channels.h).
inline constexpr absl::Duration kStepFrameTimeout = absl::Seconds(10);

// The most a frame may carry, as gRPC's default receive limit on our
// daemons.
inline constexpr size_t kMaxFrameBytes = 64 << 20;
// Writes `bytes` as one frame. UNAVAILABLE when the peer is gone or the
// write timed out.
absl::Status WriteFrame(int fd, const std::string& bytes);
// Reads one frame into `bytes`: OUT_OF_RANGE when the stream ends cleanly
// before the frame (the peer closed between frames), UNAVAILABLE when it
// ends inside one, on a timeout or an error; RESOURCE_EXHAUSTED for a frame
// over `max_bytes`.
absl::Status ReadFrame(int fd, std::string* bytes, size_t max_bytes = kMaxFrameBytes);

// The same framing over another byte stream (TLS: common/frame_conn.h).
// `io` moves up to `n` bytes as recv and send do: how many (> 0), 0 at the
// end of the stream, or -1 with errno set (EAGAIN: the socket's timeout).
using ByteIo = absl::FunctionRef<ssize_t(char* data, size_t n)>;
absl::Status WriteFrame(ByteIo send, const std::string& bytes);
absl::Status ReadFrame(ByteIo recv, std::string* bytes, size_t max_bytes = kMaxFrameBytes);

}  // namespace baton

#endif  // BATON_COMMON_TCP_H_
