#include "common/net_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace baton {

bool RefusesConnections(const std::string& address, absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), address.substr(colon + 1).c_str(), &hints, &found) != 0 || found == nullptr) return false;
  bool refused = false;
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
      if (errno == ECONNREFUSED) {
        refused = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
          int error = 0;
          socklen_t len = sizeof(error);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
          refused = error == ECONNREFUSED;
        }
      }
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  return refused;
}

}  // namespace baton
