// baton-controller: serves baton.v1.Registry (workers) and baton.v1.Controller
// (clients) on one port, plus grpc.health.v1, until SIGINT/SIGTERM.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kv_store.h"
#include "common/process.h"
#include "common/security.h"
#include "common/daemon_flags.h"
#include "common/daemon_server.h"
#include "common/file_root.h"
#include "common/http_server.h"
#include "common/json.h"
#include "common/log.h"
#include "common/metrics.h"
#include "controller/controller_metrics.h"
#include "controller/controller_service.h"
#include "controller/status_page.h"
#include "controller/event_log.h"
#include "controller/registry_service.h"
#include "controller/worker_registry.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind.");
ABSL_FLAG(int, port, 0, "Port; 0 lets the OS choose.");
ABSL_FLAG(std::string, port_file, "", "If set, write HOST:PORT here once serving.");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 500, "Heartbeat period asked of workers.");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 3000,
          "A worker is DEAD after this long without a heartbeat. Detection takes at most "
          "heartbeat_timeout_ms + 200 ms (the sweep period).");
ABSL_FLAG(int64_t, rendezvous_timeout_ms, 10000,
          "How long workers may take to connect the communicators of a new mesh.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Checkpoint directories and init_from files resolve only under this directory (default: the working "
          "directory).");
ABSL_FLAG(int64_t, checkpoint_block_bytes, 1 << 20, "Checksum block of saved chunks (a resharding load reads whole blocks).");
ABSL_FLAG(std::string, client_token_file, "",
          "File holding the token clients must send (else $BATON_CLIENT_TOKEN_FILE or $BATON_CLIENT_TOKEN).");
ABSL_FLAG(int64_t, forget_dead_after_ms, 600000, "A worker DEAD this long is forgotten (its name and slot freed).");
ABSL_FLAG(int, max_threads, 512, "Most server threads; RPCs beyond get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_message_bytes, 16 << 20,
          "Largest request accepted; larger ones get RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, default_backend, "gloo",
          "Collectives backend of meshes whose request does not name one: gloo (CPU) or nccl (GPU).");

namespace baton {
namespace {

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (auto s = InitDaemonLogging("controller"); !s.ok()) {
    Logf("baton-controller: %s", s.ToString().c_str());
    return 2;
  }
  sigset_t signals = BlockTerminationSignals();
  UseReturningAllocation();

  auto client_token = LoadToken(absl::GetFlag(FLAGS_client_token_file), "BATON_CLIENT_TOKEN");
  if (!client_token.ok()) {
    Logf("baton-controller: %s", client_token.status().ToString().c_str());
    return 2;
  }
  // TLS material, and the worker token the controller presents to workers.
  auto credentials = DaemonCredentials();
  if (!credentials.ok()) {
    Logf("baton-controller: %s", credentials.status().ToString().c_str());
    return 2;
  }
  if (auto s = Authenticator::Validate(*client_token, credentials->token); !s.ok()) {
    Logf("baton-controller: %s", s.ToString().c_str());
    return 2;
  }
  const Authenticator auth(*client_token, credentials->token);
  const std::string host = absl::GetFlag(FLAGS_host);
  if (auto s = CheckExposure(host, auth.enabled(), "--client_token_file and --worker_token_file"); !s.ok()) {
    Logf("baton-controller: %s", std::string(s.message()).c_str());
    return 2;
  }
  if (!auth.enabled()) Logf("baton-controller: no tokens configured: calls are not authenticated");

  EventLog events;
  KeyValueStore kv;
  WorkerRegistry registry(absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms)), &events);
  registry.set_forget_after(absl::Milliseconds(absl::GetFlag(FLAGS_forget_dead_after_ms)));
  RegistryService registry_service(&registry, &kv, absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms)),
                                   auth);
  ControllerMetrics metrics;
  ControllerOptions options;
  options.auth = auth;
  options.metrics = &metrics;
  if (const std::string b = absl::GetFlag(FLAGS_default_backend); b == "nccl" || b == "gloo") {
    options.default_backend = b == "nccl" ? baton::v1::NCCL : baton::v1::GLOO;
  } else {
    Logf("baton-controller: --default_backend must be gloo or nccl, not \"%s\"", b.c_str());
    return 2;
  }
  options.worker_credentials = *credentials;
  options.rendezvous_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rendezvous_timeout_ms));
  options.file_root = RootOrWorkingDirectory(absl::GetFlag(FLAGS_checkpoint_root));
  options.checkpoint_block_bytes = absl::GetFlag(FLAGS_checkpoint_block_bytes);
  ControllerService controller_service(&registry, &kv, &events, options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  DaemonServerConfig server_config;
  server_config.address = absl::StrCat(host, ":", absl::GetFlag(FLAGS_port));
  server_config.credentials = *credentials;
  server_config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  server_config.max_threads = absl::GetFlag(FLAGS_max_threads);
  server_config.metrics = &metrics.registry();
  ConfigureDaemonServer(server_config, builder, &port);
  builder.RegisterService(&registry_service);
  builder.RegisterService(&controller_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    Logf("baton-controller: cannot listen on %s:%d", host.c_str(), absl::GetFlag(FLAGS_port));
    return 1;
  }
  auto http = StartHttpIfAsked(
      "controller", host, HttpPortFlag(),
      {{"/", [] { return HttpResponse{200, "text/html; charset=utf-8", StatusPageHtml()}; }},
       {"/api/status",
        [&] { return HttpResponse{200, "application/json", ProtoToJson(controller_service.Snapshot(true))}; }},
       {"/metrics",
        [&] {
          metrics.Refresh(controller_service.Snapshot(false));
          return MetricsResponse(metrics.registry());
        }}});
  if (!http.ok()) {
    Logf("baton-controller: %s", http.status().ToString().c_str());
    return 1;
  }
  if (*http != nullptr) controller_service.set_http_address(absl::StrCat(host, ":", (*http)->port()));
  controller_service.Start();
  const std::string address = absl::StrCat(host, ":", port);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    WriteFileAtomically(absl::GetFlag(FLAGS_port_file), address);
  }
  Logf("controller serving on %s", address.c_str());

  int sig = 0;
  sigwait(&signals, &sig);
  // Draining: probes see NOT_SERVING while calls in flight finish.
  DrainServer(*server, "controller");
  controller_service.Stop();
  http->reset();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  Logf("controller stopped");
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
