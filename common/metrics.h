// Prometheus metrics of the daemons: prometheus-cpp's registry and text
// serializer (not hand-written exposition), and a gRPC server interceptor
// that times every RPC.
#ifndef BATON_COMMON_METRICS_H_
#define BATON_COMMON_METRICS_H_

#include <memory>
#include <string>

#include "common/http_server.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton {

// GET /metrics: `registry` in the Prometheus text format, version 0.0.4.
HttpResponse MetricsResponse(const prometheus::Registry& registry);

// Buckets for durations from 100 µs to ~100 s (factor ~2.5).
const prometheus::Histogram::BucketBoundaries& DurationBuckets();

// baton_rpc_duration_seconds{method, code, transport} in one registry: each
// call's time from its arrival to its status. gRPC calls are observed by
// RpcLatencyInterceptor (transport "grpc"); a worker's steps that arrive over
// its step channel (worker/step_channel.h) are observed with transport
// "step_channel", so a method's count is every call served, either way.
class RpcDurations {
 public:
  explicit RpcDurations(prometheus::Registry& registry);
  void Observe(const std::string& method, grpc::StatusCode code, const std::string& transport, double seconds);

 private:
  prometheus::Family<prometheus::Histogram>& family_;
};

// Observes each gRPC call into RpcDurations(registry), e.g.
// baton_rpc_duration_seconds{method="/baton.v1.Controller/Step", code="OK", transport="grpc"}.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcLatencyInterceptor(
    prometheus::Registry& registry);

}  // namespace baton

#endif  // BATON_COMMON_METRICS_H_
