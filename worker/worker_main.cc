// baton-worker: serves baton.v1.Worker (and grpc.health.v1), registers with
// the controller and heartbeats until SIGINT/SIGTERM.
//
// Threads: main (waits for a signal, then shuts down), the gRPC server's
// pool, and the registrar (register, then heartbeat; re-register when the
// controller no longer knows this worker, e.g. after it restarted).
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/blas_kernels.h"
#include "common/daemon_flags.h"
#include "common/daemon_server.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/process.h"
#include "proto/registry.grpc.pb.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/device/device.h"
#include "worker/caching_allocator.h"
#include "worker/model/linear.h"
#include "worker/grpc_rendezvous.h"
#include "worker/worker_metrics.h"
#include "common/file_root.h"
#include "common/security.h"
#include "worker/worker_service.h"

ABSL_FLAG(std::string, controller, "", "Controller address HOST:PORT (required).");
ABSL_FLAG(std::string, name, "", "Stable worker name (default: worker-<pid>).");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to bind and advertise, for gRPC and for the collectives.");
ABSL_FLAG(int, port, 0, "gRPC port; 0 lets the OS choose.");
ABSL_FLAG(std::string, port_file, "", "If set, write HOST:PORT here once serving.");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 500, "Heartbeat period.");
ABSL_FLAG(int64_t, register_timeout_ms, 30000,
          "Give up (exit 1) if the controller cannot be reached for this long.");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "Largest gRPC message accepted.");
ABSL_FLAG(int64_t, controller_reconnect_max_ms, 1000,
          "Longest pause between attempts to reach a controller that went away: a restarted controller has its "
          "workers back within about this long plus one heartbeat (gRPC's own backoff grows to minutes).");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Checkpoint files are read and written only under this directory (default: the working directory).");
ABSL_FLAG(std::string, data_root, "",
          "Token files a job names are opened only under this directory (default: the working directory).");
ABSL_FLAG(bool, gloo_shared_memory, true,
          "gloo groups whose ranks all run on this host move all-reduce, all-gather and reduce-scatter "
          "through shared memory (/dev/shm) instead of loopback TCP.");
ABSL_FLAG(int, cuda_device, 0,
          "The GPU this worker's NCCL groups use: an index among the CUDA devices it sees, modulo their "
          "number (`baton up` numbers its workers 0, 1, ...; one GPU per pod: 0).");
ABSL_FLAG(std::string, device, "",
          "What this worker computes on: cpu, cuda or cuda:N. Default: cpu when no GPU is visible, else the "
          "--cuda_device one. Jobs are placed only on workers of the kind their job file asks for (device: CPU | "
          "CUDA).");
ABSL_FLAG(bool, step_channel, true,
          "Offer each mesh's controller a step channel: its RunStep calls over one TCP connection, "
          "authenticated by a secret from Configure, instead of gRPC calls (docs/control_plane.md); inside "
          "TLS with the fleet's certificates when --tls_* are given.");
ABSL_FLAG(int64_t, controller_lost_ms, 15 * 60 * 1000,
          "A mesh whose controller cannot be reached for this long is dropped (its communicators and threads "
          "freed); the job's state on it is kept for a restarted controller, as for any dropped mesh, up to 15 "
          "minutes more (worker/retained_state.h).");
ABSL_FLAG(int64_t, testing_write_delay_ms, 0, "Tests only: sleep this long before each piece a save writes.");
ABSL_FLAG(std::string, testing_slow_compute, "",
          "Tests only: NAME=FRACTION makes the worker named NAME compute FRACTION slower each step (a straggler); "
          "other workers ignore it.");

namespace baton {
namespace {

constexpr absl::Duration kRpcDeadline = absl::Seconds(2);

std::string Incarnation() {
  return absl::StrCat(getpid(), "-", absl::ToUnixNanos(absl::Now()));
}

// Registers, then heartbeats every `interval` until `stop` is notified.
// Returns false if it never got registered within the register timeout.
bool RunRegistrar(baton::v1::Registry::Stub* stub, const baton::v1::WorkerInfo& info,
                  absl::Notification* stop, absl::Notification* registered,
                  const std::function<void(absl::Duration)>& on_lost) {
  const absl::Duration lost_after = absl::Milliseconds(absl::GetFlag(FLAGS_controller_lost_ms));
  absl::Time last_contact = absl::Now();
  bool lost = false;  // on_lost called since the last contact
  absl::Duration interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  absl::Time give_up = absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_register_timeout_ms));
  bool known = false;
  while (!stop->HasBeenNotified()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kRpcDeadline));
    if (!known) {
      baton::v1::RegisterRequest req;
      *req.mutable_worker() = info;
      baton::v1::RegisterResponse resp;
      grpc::Status s = stub->Register(&ctx, req, &resp);
      if (s.ok()) {
        last_contact = absl::Now();
        lost = false;
        known = true;
        give_up = absl::InfiniteFuture();
        if (!registered->HasBeenNotified()) registered->Notify();
        Logf("worker %s registered as rank %d", info.name().c_str(), resp.rank());
        if (resp.heartbeat_interval_ms() > 0) {
          interval = absl::Milliseconds(resp.heartbeat_interval_ms());
        }
      } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                 s.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
                 s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                 s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        Logf("worker %s: registration refused: %s", info.name().c_str(),
                     s.error_message().c_str());
        return false;
      } else if (absl::Now() > give_up) {
        Logf("worker %s: controller unreachable: %s", info.name().c_str(),
                     s.error_message().c_str());
        return false;
      }
    } else {
      baton::v1::HeartbeatRequest req;
      req.set_worker_name(info.name());
      req.set_incarnation(info.incarnation());
      baton::v1::HeartbeatResponse resp;
      grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
      if (s.ok()) {
        last_contact = absl::Now();
        lost = false;
      }
      if (s.ok() && !resp.known()) {
        Logf("worker %s: controller forgot us; registering again",
                     info.name().c_str());
        known = false;
        continue;
      }
    }
    if (known && !lost && absl::Now() - last_contact > lost_after) {
      lost = true;
      on_lost(absl::Now() - last_contact);
    }
    stop->WaitForNotificationWithTimeout(interval);
  }
  return true;
}

int Main(int argc, char** argv) {
  ExecWithFullBlasKernels(argv);  // first: it may start this process again
  absl::ParseCommandLine(argc, argv);
  if (auto s = InitDaemonLogging("worker"); !s.ok()) {
    Logf("baton-worker: %s", s.ToString().c_str());
    return 2;
  }
  const std::string blas_core = OpenBlasCore();  // "" without OpenBLAS
  if (!blas_core.empty()) Logf("baton-worker: %s", BlasKernelsLine().c_str());
  const std::string controller = absl::GetFlag(FLAGS_controller);
  if (controller.empty()) {
    Logf("baton-worker: --controller HOST:PORT is required");
    return 2;
  }
  // Signals are handled by sigwait in main; block them before any thread
  // starts so every thread inherits the mask.
  sigset_t signals = BlockTerminationSignals();
  UseCachingAllocation();  // the heap, for what is not a tensor
  // Tensors (worker/caching_allocator.h), unless a benchmark compares.
  InstallTensorAllocatorFromEnvironment();
  Logf("baton-worker: %s", WarmLinear().c_str());
  // Abseil's lock-cycle detection (on in Debian's build of it) walks a graph
  // on every lock: a fifth of the controller's time at a thousand workers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  IgnoreBrokenPipes();

  const std::string host = absl::GetFlag(FLAGS_host);
  auto credentials = DaemonCredentials();
  if (!credentials.ok()) {
    Logf("baton-worker: %s", credentials.status().ToString().c_str());
    return 2;
  }
  if (auto s = CheckExposure(host, !credentials->token.empty(), "--worker_token_file"); !s.ok()) {
    Logf("baton-worker: %s", std::string(s.message()).c_str());
    return 2;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(absl::GetFlag(FLAGS_max_message_bytes)));
  const int reconnect_max_ms = static_cast<int>(std::max<int64_t>(100, absl::GetFlag(FLAGS_controller_reconnect_max_ms)));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, reconnect_max_ms));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(100, reconnect_max_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, reconnect_max_ms);
  auto channel = MakeChannel(controller, *credentials, args);
  std::shared_ptr<baton::v1::Registry::Stub> registry = baton::v1::Registry::NewStub(channel);
  GrpcRendezvous rendezvous(registry);

  baton::v1::WorkerInfo info;
  info.set_name(absl::GetFlag(FLAGS_name).empty() ? absl::StrCat("worker-", getpid())
                                                  : absl::GetFlag(FLAGS_name));
  info.set_pid(getpid());
  info.set_incarnation(Incarnation());
  info.set_cpu_cores(static_cast<int>(std::thread::hardware_concurrency()));
  info.set_memory_bytes(AvailableMemoryBytes());
  auto* cpu = info.add_devices();
  cpu->set_kind("cpu");
  cpu->set_description(absl::StrCat(std::thread::hardware_concurrency(), " cores",
                                    blas_core.empty() ? "" : absl::StrCat(", ", blas_core, " BLAS kernels")));
  const int cuda_device = absl::GetFlag(FLAGS_cuda_device);
  if (cuda_device < 0) {
    std::fprintf(stderr, "baton-worker: --cuda_device must be >= 0 (got %d)\n", cuda_device);
    return 2;
  }
  const int cuda_devices = CudaDeviceCount();
  auto device = ResolveDevice(absl::GetFlag(FLAGS_device), cuda_device, cuda_devices);
  if (!device.ok()) {
    std::fprintf(stderr, "baton-worker: %s\n", std::string(device.status().message()).c_str());
    return 2;
  }
  info.set_compute_device(*device);
  const int computing_gpu = CudaIndexOf(*device);  // -1 on the CPU
  // A GPU worker's jobs hold their tensors on the GPU: what it has free is
  // what a job's per-rank prediction must fit (controller/job_fit.h).
  if (computing_gpu >= 0) info.set_memory_bytes(CudaFreeBytes(computing_gpu));
  for (int d = 0; d < cuda_devices; ++d) {
    auto* gpu = info.add_devices();
    gpu->set_kind("cuda");
    gpu->set_index(d);
    if (d == (computing_gpu >= 0 ? computing_gpu : cuda_device % cuda_devices)) {
      gpu->set_description(computing_gpu >= 0 ? "computes here (--device)" : "NCCL's (--cuda_device)");
    }
  }

  WorkerMetrics metrics;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  DaemonServerConfig server_config;
  server_config.address = absl::StrCat(host, ":", absl::GetFlag(FLAGS_port));
  server_config.credentials = *credentials;
  server_config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  server_config.metrics = &metrics.registry();
  ConfigureDaemonServer(server_config, builder, &port);
  WorkerOptions options;
  options.file_root = RootOrWorkingDirectory(absl::GetFlag(FLAGS_checkpoint_root));
  options.data_root = RootOrWorkingDirectory(absl::GetFlag(FLAGS_data_root));
  options.testing_write_delay_ms = absl::GetFlag(FLAGS_testing_write_delay_ms);
  if (const std::string slow = absl::GetFlag(FLAGS_testing_slow_compute); !slow.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(slow, absl::MaxSplits('=', 1));
    double fraction = 0;
    if (parts.size() != 2 || !absl::SimpleAtod(parts[1], &fraction) || fraction < 0 || fraction > 100) {
      std::fprintf(stderr, "baton-worker: --testing_slow_compute wants NAME=FRACTION, got \"%s\"\n", slow.c_str());
      return 2;
    }
    if (parts[0] == info.name()) options.testing_slow_compute = fraction;
  }
  options.gloo_shared_memory = absl::GetFlag(FLAGS_gloo_shared_memory);
  // A GPU worker's collectives run on the device it computes on.
  options.cuda_device = computing_gpu >= 0 ? computing_gpu : cuda_device;
  options.device = *device;
  options.step_channel = absl::GetFlag(FLAGS_step_channel);
  options.auth = Authenticator("", credentials->token);
  options.metrics = &metrics;
  // Peers read each other's retained state (recovery, rescale) as the fleet.
  options.fleet_credentials = *credentials;
  WorkerService service(info, &rendezvous, host, options);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    Logf("baton-worker: cannot listen on %s:%d", host.c_str(),
                 absl::GetFlag(FLAGS_port));
    return 1;
  }
  auto http = StartHttpIfAsked("worker", host, HttpPortFlag(), {{"/metrics", [&metrics] {
                                 metrics.Refresh();
                                 return MetricsResponse(metrics.registry());
                               }}});
  if (!http.ok()) {
    Logf("baton-worker: %s", http.status().ToString().c_str());
    return 1;
  }
  if (*http != nullptr) info.set_http_address(absl::StrCat(host, ":", (*http)->port()));
  info.set_address(absl::StrCat(host, ":", port));
  service.set_identity(info);  // the address is known only once bound
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    WriteFileAtomically(absl::GetFlag(FLAGS_port_file), info.address());
  }
  Logf("worker %s serving on %s (controller %s)", info.name().c_str(),
               info.address().c_str(), controller.c_str());

  // SERVING only once registered: before that the fleet cannot use it.
  server->GetHealthCheckService()->SetServingStatus(false);
  absl::Notification stop, registered;
  std::atomic<bool> registrar_failed{false};
  std::thread serving([&] {
    while (!registered.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      if (stop.HasBeenNotified()) return;
    }
    if (!stop.HasBeenNotified()) server->GetHealthCheckService()->SetServingStatus(true);
  });
  std::thread registrar([&] {
    auto on_lost = [&service](absl::Duration silent) {
      service.DropMesh(absl::StrCat("the controller has not answered for ", absl::FormatDuration(silent),
                                    " (--controller_lost_ms)"));
    };
    if (!RunRegistrar(registry.get(), info, &stop, &registered, on_lost)) {
      registrar_failed = true;
      kill(getpid(), SIGTERM);  // wake main's sigwait
    }
  });

  int sig = 0;
  sigwait(&signals, &sig);
  stop.Notify();
  serving.join();
  DrainServer(*server, absl::StrCat("worker ", info.name()));
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  registrar.join();
  http->reset();
  Logf("worker %s stopped", info.name().c_str());
  return registrar_failed ? 1 : 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
