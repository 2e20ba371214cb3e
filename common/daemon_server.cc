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

}  // namespace

void ConfigureDaemonServer(const DaemonServerConfig& config, grpc::ServerBuilder& builder, int* port) {
  builder.AddListeningPort(config.address, MakeServerCredentials(config.credentials), port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // Without SO_REUSEPORT each of gRPC's pollers cannot bind port 0 on its
  // own: one listening port, the advertised one.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
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
