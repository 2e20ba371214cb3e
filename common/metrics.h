// Prometheus metrics of the daemons: prometheus-cpp's registry and text
// serializer (not hand-written exposition), and a gRPC server interceptor
// that times every RPC.
#ifndef BATON_COMMON_METRICS_H_
#define BATON_COMMON_METRICS_H_

#include <memory>

#include "common/http_server.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton {

// GET /metrics: `registry` in the Prometheus text format, version 0.0.4.
HttpResponse MetricsResponse(const prometheus::Registry& registry);

// Buckets for durations from 100 µs to ~100 s (factor ~2.5).
const prometheus::Histogram::BucketBoundaries& DurationBuckets();

// Observes each RPC's time from its arrival to its status into
// baton_rpc_duration_seconds{method="/baton.v1.Controller/Step", code="OK"}.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcLatencyInterceptor(
    prometheus::Registry& registry);

}  // namespace baton

#endif  // BATON_COMMON_METRICS_H_
