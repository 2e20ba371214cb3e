#include "common/net_probe.h"

#include <cstdlib>

#include "common/tcp.h"

namespace baton {

bool RefusesConnections(const std::string& address, absl::Duration timeout) {
  auto split = SplitHostPort(address);
  if (!split.ok()) return false;
  char* end = nullptr;
  const long port = std::strtol(split->second.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) return false;
  auto connected = ConnectTcp(split->first, static_cast<int>(port), timeout);
  return !connected.ok() && IsConnectionRefused(connected.status());
}

}  // namespace baton
