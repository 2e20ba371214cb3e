#include "common/net_probe.h"

#include "absl/strings/numbers.h"
#include "common/tcp.h"

namespace baton {

bool RefusesConnections(const std::string& address, absl::Duration timeout) {
  auto split = SplitHostPort(address);
  if (!split.ok()) return false;
  int port = 0;
  if (!absl::SimpleAtoi(split->second, &port) || port <= 0 || port > 65535) return false;
  auto connected = ConnectTcp(split->first, port, timeout);
  return !connected.ok() && IsConnectionRefused(connected.status());
}

}  // namespace baton
