// baton-controller: serves baton.v1.Registry (workers) and baton.v1.Controller
// (clients) on one port, plus grpc.health.v1, until SIGINT/SIGTERM.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
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
#include "controller/fleet_monitor.h"
#include "controller/job_manager.h"
#include "controller/job_store.h"
#include "controller/mesh_manager.h"
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
ABSL_FLAG(std::string, state_dir, "",
          "Keep the job table here (created if missing) and read it back at start-up: detached jobs resume from "
          "their last checkpoint after a restart. Empty: jobs do not outlive the controller.");
ABSL_FLAG(int64_t, lease_ms, 10000,
          "An attached job whose client makes no call for this long is stopped and its workers freed (a client may "
          "ask for another lease in CreateJob).");
ABSL_FLAG(int64_t, retire_job_metrics_after_ms, 600000,
          "A job's /metrics series are removed this long after it ended.");
ABSL_FLAG(int64_t, max_ended_jobs, 1000, "Ended jobs kept (listed, their logs readable); the oldest are forgotten.");
ABSL_FLAG(int, max_calls_in_flight, baton::Dispatcher::kDefaultMaxInFlight,
          "Most worker RPCs in flight at once; more wait their turn.");

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
  // Abseil's lock-cycle detection (on in Debian's build of it) walks a graph
  // on every lock: a fifth of the controller's time at a thousand workers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  IgnoreBrokenPipes();
  RaiseDescriptorLimit();

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

  std::unique_ptr<JobStore> store;
  if (const std::string dir = absl::GetFlag(FLAGS_state_dir); dir.empty()) {
    store = JobStore::InMemory();
  } else {
    auto opened = JobStore::Open(dir);
    if (!opened.ok()) {
      Logf("baton-controller: --state_dir: %s", opened.status().ToString().c_str());
      return 2;
    }
    store = std::move(*opened);
  }
  baton::v1::CommBackend default_backend = baton::v1::GLOO;
  if (const std::string b = absl::GetFlag(FLAGS_default_backend); b == "nccl" || b == "gloo") {
    default_backend = b == "nccl" ? baton::v1::NCCL : baton::v1::GLOO;
  } else {
    Logf("baton-controller: --default_backend must be gloo or nccl, not \"%s\"", b.c_str());
    return 2;
  }

  EventLog events;
  KeyValueStore kv;
  WorkerRegistry registry(absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms)), &events);
  registry.set_forget_after(absl::Milliseconds(absl::GetFlag(FLAGS_forget_dead_after_ms)));

  ControllerMetrics metrics(absl::Milliseconds(absl::GetFlag(FLAGS_retire_job_metrics_after_ms)));
  Dispatcher dispatcher(GrpcStubFactory(*credentials), absl::GetFlag(FLAGS_max_calls_in_flight));
  MeshOptions mesh_options;
  mesh_options.rendezvous_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rendezvous_timeout_ms));
  mesh_options.default_backend = default_backend;
  mesh_options.next_epoch = [&store] { return store->NewEpoch(); };
  mesh_options.step_channel_tls = *credentials;
  MeshManager meshes(&registry, &kv, &events, &dispatcher, mesh_options);
  JobManagerOptions job_options;
  job_options.checkpoints.file_root = RootOrWorkingDirectory(absl::GetFlag(FLAGS_checkpoint_root));
  job_options.checkpoints.block_bytes = absl::GetFlag(FLAGS_checkpoint_block_bytes);
  job_options.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  job_options.max_ended_jobs = static_cast<size_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_max_ended_jobs)));
  JobManager jobs(&meshes, &events, &metrics, store.get(), job_options);
  meshes.set_on_mesh_lost(
      [&jobs](const std::string& owner, const baton::v1::Mesh& mesh, const std::string& why) { jobs.OnMeshLost(owner, mesh, why); });
  jobs.Recover();
  // A worker Register finds dead (its successor arrived, its address
  // refuses connections) is dead for the meshes as the monitor's are.
  RegistryService registry_service(&registry, &kv, absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms)),
                                   auth, [&meshes](const std::vector<std::string>& dead) { meshes.OnWorkersDead(dead); });
  ControllerService controller_service(&registry, &meshes, &jobs, &events, auth);
  FleetMonitor monitor(&registry, &meshes, &jobs);

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
       {"/api/trace/newest",
        [&] {
          std::string json = controller_service.newest_trace().json();
          if (json.empty()) return HttpResponse{404, "text/plain; charset=utf-8", "no trace yet: baton trace JOB\n"};
          return HttpResponse{200, "application/json", std::move(json)};
        }},
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
  monitor.Start();
  const std::string address = absl::StrCat(host, ":", port);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    WriteFileAtomically(absl::GetFlag(FLAGS_port_file), address);
  }
  Logf("controller serving on %s", address.c_str());

  int sig = 0;
  sigwait(&signals, &sig);
  // Draining: probes see NOT_SERVING while calls in flight finish.
  DrainServer(*server, "controller");
  monitor.Stop();
  // Jobs stay as they are in the state directory: the next controller
  // takes them up.
  jobs.Shutdown();
  http->reset();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  Logf("controller stopped");
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
