#include "common/metrics.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace baton {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "OTHER";
  }
}

class RpcTimer : public grpc::experimental::Interceptor {
 public:
  RpcTimer(const char* method, RpcDurations* durations)
      : method_(method == nullptr ? "" : method), durations_(durations), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      durations_->Observe(method_, methods->GetSendStatus().error_code(), "grpc", seconds);
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  RpcDurations* const durations_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcTimerFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcTimerFactory(prometheus::Registry& registry) : durations_(registry) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new RpcTimer(info->method(), &durations_);
  }

 private:
  RpcDurations durations_;
};

}  // namespace

HttpResponse MetricsResponse(const prometheus::Registry& registry) {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = prometheus::TextSerializer().Serialize(registry.Collect());
  return r;
}

const prometheus::Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* buckets = [] {
    auto* b = new prometheus::Histogram::BucketBoundaries;
    for (double s = 1e-4; s < 150; s *= 2.5) b->push_back(s);
    return b;
  }();
  return *buckets;
}

RpcDurations::RpcDurations(prometheus::Registry& registry)
    // The registry merges a second registration of the same name into the
    // first: the interceptor and a worker's step channel share one family.
    : family_(prometheus::BuildHistogram()
                  .Name("baton_rpc_duration_seconds")
                  .Help("Time from an RPC's arrival to its status, by method, status code and transport")
                  .Register(registry)) {}

void RpcDurations::Observe(const std::string& method, grpc::StatusCode code, const std::string& transport,
                           double seconds) {
  family_.Add({{"method", method}, {"code", CodeName(code)}, {"transport", transport}}, DurationBuckets())
      .Observe(seconds);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcLatencyInterceptor(
    prometheus::Registry& registry) {
  return std::make_unique<RpcTimerFactory>(registry);
}

}  // namespace baton
