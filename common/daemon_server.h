// How both daemons build their gRPC server: one listening port (the
// advertised one), credentials, message and thread bounds, keepalive for
// peers that vanish without closing, and every RPC timed for /metrics.
#ifndef BATON_COMMON_DAEMON_SERVER_H_
#define BATON_COMMON_DAEMON_SERVER_H_

#include <string>

#include "common/security.h"
#include "grpcpp/server_builder.h"
#include "prometheus/registry.h"

namespace baton {

struct DaemonServerConfig {
  std::string address;  // host:port; port 0 lets the OS choose
  Credentials credentials;
  int64_t max_message_bytes = 16 << 20;
  int max_threads = 0;  // 0: gRPC's default
  prometheus::Registry* metrics = nullptr;  // baton_rpc_duration_seconds goes here
};

// Adds the listening port (its number lands in *port once started) and the
// settings above to `builder`.
void ConfigureDaemonServer(const DaemonServerConfig& config, grpc::ServerBuilder& builder, int* port);

}  // namespace baton

#endif  // BATON_COMMON_DAEMON_SERVER_H_
