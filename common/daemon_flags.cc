#include "common/daemon_flags.h"

#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"

ABSL_FLAG(std::string, worker_token_file, "",
          "File holding the fleet's worker token (else $BATON_WORKER_TOKEN_FILE or $BATON_WORKER_TOKEN).");
ABSL_FLAG(std::string, tls_ca, "", "mTLS: CA certificate (PEM) that signs every peer's certificate.");
ABSL_FLAG(std::string, tls_cert, "", "mTLS: this daemon's certificate (PEM).");
ABSL_FLAG(std::string, tls_key, "", "mTLS: this daemon's private key (PEM).");
ABSL_FLAG(bool, allow_unauthenticated, false,
          "Serve a non-loopback address without tokens (anyone who reaches the port may drive this daemon).");
ABSL_FLAG(int64_t, drain_ms, 0,
          "On SIGTERM, report NOT_SERVING on grpc.health.v1 for this long before shutting down (time for a load "
          "balancer or Kubernetes to stop sending calls).");
ABSL_FLAG(int, http_port, -1,
          "Serve /metrics (Prometheus; on the controller also the status page / and its JSON /api/status) on "
          "this port of --host; 0 lets the OS choose, -1 (the default) serves no HTTP. Read-only and "
          "unauthenticated.");
ABSL_FLAG(std::string, log_format, "text", "Log lines on stderr: text, or json (one object per line).");

namespace baton {

absl::Status InitDaemonLogging(const std::string& daemon) {
  return SetLogFormat(absl::GetFlag(FLAGS_log_format), daemon);
}

absl::StatusOr<Credentials> DaemonCredentials() {
  auto token = LoadToken(absl::GetFlag(FLAGS_worker_token_file), "BATON_WORKER_TOKEN");
  if (!token.ok()) return token.status();
  Credentials credentials;
  credentials.token = *token;
  if (auto s = LoadTls(absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                       &credentials);
      !s.ok()) {
    return s;
  }
  return credentials;
}

absl::Status CheckExposure(const std::string& host, bool authenticated, const std::string& give) {
  if (authenticated || IsLoopbackHost(host) || absl::GetFlag(FLAGS_allow_unauthenticated)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("refusing to serve ", host, " without tokens: give ", give,
                                                    " (or pass --allow_unauthenticated)"));
}

int HttpPortFlag() { return absl::GetFlag(FLAGS_http_port); }

void DrainServer(grpc::Server& server, const std::string& who) {
  server.GetHealthCheckService()->SetServingStatus(false);
  if (const int64_t ms = absl::GetFlag(FLAGS_drain_ms); ms > 0) {
    Logf("%s draining for %lld ms", who.c_str(), static_cast<long long>(ms));
    absl::SleepFor(absl::Milliseconds(ms));
  }
}

}  // namespace baton
