// fake_worker_fleet: N fake workers in one process, for bench/dispatch.sh -
// one gRPC server (callback API: no thread per call) listening on N ports,
// each port a worker that registers with the controller under its own name
// and heartbeats; or (--shared_port) on one port that all N share, as the
// workers of one host process would: calls say which worker they are for
// (common/security.h: kAddresseeMetadata) and share one connection. They answer Configure, LoadProgram, RunStep, Abort and
// GetInfo at once, without computing anything, so what the bench measures is
// the controller's dispatch alone.
//
//   fake_worker_fleet --controller HOST:PORT --workers 1024 [--prefix fake]
//                     [--ready_file F]
//
// Runs until SIGINT/SIGTERM.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "common/security.h"
#include "proto/registry.grpc.pb.h"
#include "proto/worker.grpc.pb.h"

ABSL_FLAG(std::string, controller, "", "Controller address HOST:PORT.");
ABSL_FLAG(int, workers, 8, "Fake workers to host.");
ABSL_FLAG(std::string, prefix, "fake", "Worker names: PREFIX-0, PREFIX-1, ...");
ABSL_FLAG(std::string, ready_file, "", "Written once every worker registered.");
ABSL_FLAG(bool, shared_port, false, "All workers on one port (told apart by the addressee metadata).");

namespace baton {
namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

// Which fake a call is for: the worker it names, else the port its client
// dialled.
std::string WorkerOf(CallbackServerContext* ctx) {
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find(kAddresseeMetadata); it != metadata.end()) {
    return std::string(it->second.data(), it->second.size());
  }
  return std::string(ctx->ExperimentalGetAuthority().data(), ctx->ExperimentalGetAuthority().size());
}

class FakeFleetService final : public baton::v1::Worker::CallbackService {
 public:
  ServerUnaryReactor* Configure(CallbackServerContext* ctx, const baton::v1::ConfigureRequest* req,
                                baton::v1::ConfigureResponse* resp) override {
    {
      absl::MutexLock lock(&mu_);
      rank_[WorkerOf(ctx)] = req->rank();
    }
    resp->set_rank(req->rank());
    resp->set_backend(baton::v1::GLOO);
    return Done(ctx);
  }
  ServerUnaryReactor* LoadProgram(CallbackServerContext* ctx, const baton::v1::LoadProgramRequest*,
                                  baton::v1::LoadProgramResponse*) override {
    return Done(ctx);
  }
  ServerUnaryReactor* RunStep(CallbackServerContext* ctx, const baton::v1::RunStepRequest* req,
                              baton::v1::RunStepResponse* resp) override {
    int rank;
    {
      absl::MutexLock lock(&mu_);
      rank = rank_[WorkerOf(ctx)];
    }
    const int steps = std::max(1, req->steps());
    for (int i = 0; i < steps; ++i) {
      baton::v1::StepMetrics* m = resp->add_metrics();
      m->set_step(req->step() + i);
      m->set_has_loss(rank == 0);
      m->set_loss(1.0 / (req->step() + i));
      m->set_tokens(1);
    }
    resp->set_rank(rank);
    steps_.fetch_add(steps);
    return Done(ctx);
  }
  ServerUnaryReactor* Abort(CallbackServerContext* ctx, const baton::v1::AbortRequest*,
                            baton::v1::AbortResponse*) override {
    return Done(ctx);
  }
  ServerUnaryReactor* GetInfo(CallbackServerContext* ctx, const baton::v1::GetInfoRequest*,
                              baton::v1::GetInfoResponse*) override {
    return Done(ctx);
  }
  int64_t steps() const { return steps_.load(); }

 private:
  static ServerUnaryReactor* Done(CallbackServerContext* ctx) {
    ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  absl::Mutex mu_;
  std::map<std::string, int> rank_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> steps_{0};
};

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  sigset_t signals = BlockTerminationSignals();
  RaiseDescriptorLimit();
  // Abseil's lock-cycle detection (on in Debian's build of it) walks a graph
  // on every lock: a fifth of the controller's time at a thousand workers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const int n = absl::GetFlag(FLAGS_workers);
  const std::string controller = absl::GetFlag(FLAGS_controller);
  if (controller.empty() || n < 1) {
    std::fprintf(stderr, "usage: fake_worker_fleet --controller HOST:PORT --workers N\n");
    return 2;
  }
  FakeFleetService service;
  grpc::ServerBuilder builder;
  const bool shared = absl::GetFlag(FLAGS_shared_port);
  std::vector<int> ports(shared ? 1 : n, 0);
  for (int& port : ports) builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "fake_worker_fleet: cannot listen on %d ports\n", n);
    return 1;
  }
  auto registry = baton::v1::Registry::NewStub(grpc::CreateChannel(controller, grpc::InsecureChannelCredentials()));
  const std::string incarnation = absl::StrCat(getpid(), "-", absl::ToUnixNanos(absl::Now()));
  absl::Duration interval = absl::Milliseconds(500);
  auto register_all = [&] {
    for (int i = 0; i < n; ++i) {
      baton::v1::RegisterRequest req;
      baton::v1::WorkerInfo* w = req.mutable_worker();
      w->set_name(absl::StrCat(absl::GetFlag(FLAGS_prefix), "-", i));
      w->set_address(absl::StrCat("127.0.0.1:", ports[shared ? 0 : i]));
      w->set_pid(getpid());
      w->set_incarnation(incarnation);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      baton::v1::RegisterResponse resp;
      const grpc::Status s = registry->Register(&ctx, req, &resp);
      if (!s.ok()) {
        std::fprintf(stderr, "fake_worker_fleet: registering %s: %s\n", w->name().c_str(), s.error_message().c_str());
        return false;
      }
      if (resp.heartbeat_interval_ms() > 0) interval = absl::Milliseconds(resp.heartbeat_interval_ms());
    }
    return true;
  };
  if (!register_all()) return 1;
  std::printf("fake_worker_fleet: %d workers registered (ports %d..%d), heartbeat every %s\n", n, ports.front(),
              ports.back(), absl::FormatDuration(interval).c_str());
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_ready_file).empty()) WriteFileAtomically(absl::GetFlag(FLAGS_ready_file), "ready");
  // Heartbeats of every fake, one round each interval.
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    while (!stop.load()) {
      const absl::Time round = absl::Now();
      bool forgotten = false;
      for (int i = 0; i < n && !stop.load(); ++i) {
        baton::v1::HeartbeatRequest req;
        req.set_worker_name(absl::StrCat(absl::GetFlag(FLAGS_prefix), "-", i));
        req.set_incarnation(incarnation);
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
        baton::v1::HeartbeatResponse resp;
        if (registry->Heartbeat(&ctx, req, &resp).ok() && !resp.known()) forgotten = true;
      }
      if (forgotten) register_all();
      absl::SleepFor(interval - (absl::Now() - round));
    }
  });
  int sig = 0;
  sigwait(&signals, &sig);
  stop = true;
  heartbeats.join();
  std::printf("fake_worker_fleet: answered %lld RunStep calls\n", static_cast<long long>(service.steps()));
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
