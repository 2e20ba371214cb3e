#include "common/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// The errno a failed call set, carried with the status (IsConnectionRefused).
constexpr char kErrnoPayload[] = "baton.dev/errno";

absl::Status Errno(const std::string& what) {
  const int error = errno;
  absl::Status status = absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
  status.SetPayload(kErrnoPayload, absl::Cord(std::to_string(error)));
  return status;
}

void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct AddrInfo {
  addrinfo* found = nullptr;
  ~AddrInfo() {
    if (found != nullptr) freeaddrinfo(found);
  }
};

absl::Status Resolve(const std::string& host, const std::string& port, int flags, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  // A name as well as an address: a worker's --host may be either.
  hints.ai_flags = AI_NUMERICSERV | flags;
  if (const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &out->found);
      error != 0 || out->found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ":", port, ": ", error != 0 ? gai_strerror(error) : "no address"));
  }
  return absl::OkStatus();
}

// Moves exactly `n` bytes through `io` (the socket's timeouts bound each
// try). The end of the stream before the first byte is OUT_OF_RANGE when
// `end_may_come_first` (a peer that closed between frames), otherwise
// UNAVAILABLE as every other failure.
absl::Status Exactly(ByteIo io, char* data, size_t n, const char* what, bool end_may_come_first = false) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = io(data + done, n - done);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) {
      if (done == 0 && end_may_come_first) return absl::OutOfRangeError("the peer closed the connection");
      return absl::UnavailableError(absl::StrCat(what, ": the connection was closed"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(what, ": timed out after ", done, " of ", n, " bytes"));
    }
    return Errno(what);
  }
  return absl::OkStatus();
}

}  // namespace

void ScopedFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" has no port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(std::move(host), address.substr(colon + 1));
}

absl::StatusOr<ScopedFd> ConnectTcp(const std::string& host, int port, absl::Duration timeout) {
  AddrInfo found;
  if (absl::Status s = Resolve(host, std::to_string(port), 0, &found); !s.ok()) return s;
  ScopedFd fd(::socket(found.found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket");
  const std::string where = absl::StrCat("connecting to ", host, ":", port);
  if (::connect(fd.get(), found.found->ai_addr, found.found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return Errno(where);
    pollfd p{fd.get(), POLLOUT, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    if (ready == 0) return absl::DeadlineExceededError(absl::StrCat(where, ": timed out"));
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (ready < 0 || error != 0) {
      errno = ready < 0 ? errno : error;
      return Errno(where);
    }
  }
  // Blocking from here on, bounded by the socket's timeouts.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  NoDelay(fd.get());
  return fd;
}

bool IsConnectionRefused(const absl::Status& status) {
  const auto error = status.GetPayload(kErrnoPayload);
  return error.has_value() && *error == std::to_string(ECONNREFUSED);
}

absl::StatusOr<std::pair<ScopedFd, int>> ListenTcp(const std::string& host) {
  AddrInfo found;
  if (absl::Status s = Resolve(host, "0", AI_PASSIVE, &found); !s.ok()) return s;
  ScopedFd fd(::socket(found.found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket");
  if (::bind(fd.get(), found.found->ai_addr, found.found->ai_addrlen) != 0) return Errno(absl::StrCat("bind ", host));
  if (::listen(fd.get(), 4) != 0) return Errno("listen");
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) return Errno("getsockname");
  const int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::make_pair(std::move(fd), port);
}

absl::StatusOr<ScopedFd> AcceptTcp(int fd) {
  ScopedFd conn(::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn.valid()) return Errno("accept");
  NoDelay(conn.get());
  return conn;
}

void SetIoTimeout(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

absl::Status WriteFrame(ByteIo send, const std::string& bytes) {
  if (bytes.size() > kMaxFrameBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("frame of ", bytes.size(), " bytes over the ", kMaxFrameBytes, " limit"));
  }
  // One send for header and body: one segment (or TLS record) for a small
  // frame.
  std::string frame(4, '\0');
  const uint32_t n = static_cast<uint32_t>(bytes.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame += bytes;
  return Exactly(send, frame.data(), frame.size(), "writing a frame");
}

absl::Status ReadFrame(ByteIo recv, std::string* bytes, size_t max_bytes) {
  unsigned char header[4];
  if (absl::Status s = Exactly(recv, reinterpret_cast<char*>(header), 4, "reading a frame's length",
                               /*end_may_come_first=*/true);
      !s.ok()) {
    return s;
  }
  const size_t n = header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<size_t>(header[3]) << 24);
  if (n > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("frame of ", n, " bytes over the ", max_bytes, " limit"));
  }
  bytes->resize(n);
  return Exactly(recv, bytes->data(), n, "reading a frame");
}

absl::Status WriteFrame(int fd, const std::string& bytes) {
  return WriteFrame([fd](char* data, size_t n) { return ::send(fd, data, n, MSG_NOSIGNAL); }, bytes);
}

absl::Status ReadFrame(int fd, std::string* bytes, size_t max_bytes) {
  return ReadFrame([fd](char* data, size_t n) { return ::recv(fd, data, n, 0); }, bytes, max_bytes);
}

}  // namespace baton
