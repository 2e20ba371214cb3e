#include "common/daemon_server.h"

#include <memory>
#include <vector>

#include "common/metrics.h"
#include "grpcpp/resource_quota.h"

namespace baton {
namespace {

// A Watch client that disappears without closing its stream (a cut link, a
// killed laptop) is noticed within a minute and its stream freed.
constexpr int kKeepaliveTimeMs = 30000;
constexpr int kKeepaliveTimeoutMs = 10000;
// Threads of the synchronous server kept polling once their call returned.
// gRPC's default (2) made a step-per-call worker create and end a thread
// per call: a RunStep waits for its turn while the one before it runs, so
// two handlers block at once, and the thread a finished call freed found
// two pollers already and exited, while the next call, arriving before it
// returned, took the last poller and started a new one.
constexpr int kMaxPollers = 4;

}  // namespace

void ConfigureDaemonServer(const DaemonServerConfig& config, grpc::ServerBuilder& builder, int* port) {
  builder.AddListeningPort(config.address, MakeServerCredentials(config.credentials), port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // Without SO_REUSEPORT each of gRPC's pollers cannot bind port 0 on its
  // own: one listening port, the advertised one.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kMaxPollers);
  if (config.max_threads > 0) {
    grpc::ResourceQuota quota("baton-daemon");
    quota.SetMaxThreads(config.max_threads);
    builder.SetResourceQuota(quota);  // the builder keeps its own reference
  }
  if (config.metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(RpcLatencyInterceptor(*config.metrics));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
}

}  // namespace baton
