// What both daemons (baton-controller, baton-worker) take from their command
// line alike: the worker token and TLS files, --allow_unauthenticated,
// --drain_ms, --http_port and --log_format, and the start-up and shutdown
// steps those flags drive.
#ifndef BATON_COMMON_DAEMON_FLAGS_H_
#define BATON_COMMON_DAEMON_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/security.h"
#include "grpcpp/server.h"

namespace baton {

// Applies --log_format; `daemon` names the process in JSON lines.
absl::Status InitDaemonLogging(const std::string& daemon);

// The fleet's worker token (--worker_token_file, else $BATON_WORKER_TOKEN[_FILE])
// and the TLS material of --tls_ca/--tls_cert/--tls_key.
absl::StatusOr<Credentials> DaemonCredentials();

// Serving `host` without authentication is refused unless it is loopback or
// --allow_unauthenticated is given; `give` says which flags would close it.
absl::Status CheckExposure(const std::string& host, bool authenticated, const std::string& give);

// --http_port (-1: no HTTP).
int HttpPortFlag();

// On shutdown: `server` reports NOT_SERVING on grpc.health.v1, then waits
// --drain_ms while calls in flight finish (`who` names it in the log).
void DrainServer(grpc::Server& server, const std::string& who);

}  // namespace baton

#endif  // BATON_COMMON_DAEMON_FLAGS_H_
