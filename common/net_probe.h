// Whether anything listens at an address: a process known to have served
// there is gone when a TCP connection is refused (nothing listens), which a
// timeout or an unreachable host does not say.
#ifndef BATON_COMMON_NET_PROBE_H_
#define BATON_COMMON_NET_PROBE_H_

#include <string>

#include "absl/time/time.h"

namespace baton {

// Whether a TCP connection to `address` (numeric HOST:PORT, IPv4 or [IPv6])
// is refused within `timeout`. A timeout, an unreachable host or a name to
// resolve say nothing (false).
bool RefusesConnections(const std::string& address, absl::Duration timeout);

}  // namespace baton

#endif  // BATON_COMMON_NET_PROBE_H_
