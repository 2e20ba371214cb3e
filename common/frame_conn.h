// FrameConn: one connection of a mesh's step channel (docs/control_plane.md,
// "Step channel"), carrying common/tcp.h's frames in the clear or inside
// TLS. A fleet with mutual TLS keeps it on its step channels: the worker is
// the TLS server and requires a client certificate; both ends verify the
// peer's chain against the fleet's CA, and the controller also checks that
// the worker's certificate names the host it connected to (as its gRPC
// calls do). TLS 1.2 at least, no session tickets (nothing is resumed, and
// no record arrives that is not a frame's).
//
// Blocking I/O bounded by the socket's timeouts (SetIoTimeout), also for
// the handshake. A frame is written in one TLS write and read whole, and
// records are not read ahead, so when a frame has been read the socket
// holds whatever comes next: poll on fd() tells when the next frame is
// there, TLS or not.
//
// Not thread-safe: one thread reads and writes (Shutdown may come from
// any).
#ifndef BATON_COMMON_FRAME_CONN_H_
#define BATON_COMMON_FRAME_CONN_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/security.h"
#include "common/tcp.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace baton {

// One end's TLS settings (certificate, key, the CA it verifies its peer
// against), read from the PEM texts once and shared by its connections.
class TlsContext {
 public:
  enum class Side { kServer, kClient };
  // nullptr (and no error) when `tls` has no CA, certificate and key: that
  // end's connections are in the clear.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Make(const Credentials& tls, Side side);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

 private:
  friend class FrameConn;
  explicit TlsContext(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* const ctx_;
};

class FrameConn {
 public:
  // In the clear.
  explicit FrameConn(ScopedFd fd);
  ~FrameConn();
  FrameConn(const FrameConn&) = delete;
  FrameConn& operator=(const FrameConn&) = delete;

  // The accepting end of `fd`: TLS with `tls` (a kServer context;
  // handshaken now, the client must present a certificate signed by its
  // CA), in the clear when it is null.
  static absl::StatusOr<std::unique_ptr<FrameConn>> Server(ScopedFd fd, const TlsContext* tls);
  // The connecting end of `fd`, dialled at `host`: TLS with `tls` (a kClient
  // context; handshaken now, the server's certificate must be signed by its
  // CA and name `host`, an address or a name), in the clear when it is null.
  static absl::StatusOr<std::unique_ptr<FrameConn>> Client(ScopedFd fd, const std::string& host,
                                                           const TlsContext* tls);

  int fd() const { return fd_.get(); }
  bool tls() const { return tls_ != nullptr; }

  // common/tcp.h's WriteFrame and ReadFrame, through TLS when it has it.
  absl::Status Write(const std::string& bytes);
  absl::Status Read(std::string* bytes, size_t max_bytes = kMaxFrameBytes);
  // Shuts the socket down both ways: the peer sees the end of the stream,
  // and a read or write here fails at once.
  void Shutdown();

 private:
  struct Tls;
  FrameConn(ScopedFd fd, std::unique_ptr<Tls> tls);

  ScopedFd fd_;
  std::unique_ptr<Tls> tls_;  // null in the clear
};

}  // namespace baton

#endif  // BATON_COMMON_FRAME_CONN_H_
