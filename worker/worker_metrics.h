// A worker's Prometheus metrics (GET /metrics on --http_port): steps, bytes
// sent by collective, time per instruction kind, state held and memory.
#ifndef BATON_WORKER_WORKER_METRICS_H_
#define BATON_WORKER_WORKER_METRICS_H_

#include <string>

#include "common/metrics.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/job.pb.h"
#include "worker/step_detail.h"

namespace baton {

class WorkerMetrics {
 public:
  WorkerMetrics();
  prometheus::Registry& registry() { return registry_; }

  // This rank's figures for one step of `job`, and those only the worker
  // uses (by collective, by instruction kind).
  void ObserveStep(const std::string& job, const baton::v1::StepMetrics& m, const StepDetail& detail);
  void ObserveFailedStep(const std::string& job);
  // A RunStep call served over the mesh's step channel, from its arrival to
  // its answer: counted in baton_rpc_duration_seconds beside the gRPC ones
  // (transport "step_channel").
  void ObserveStepChannelCall(grpc::StatusCode code, double seconds);
  // Process gauges (resident memory); call before a scrape.
  void Refresh();

 private:
  prometheus::Registry registry_;
  RpcDurations rpc_durations_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& failed_steps_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& comm_bytes_;
  prometheus::Family<prometheus::Counter>& instruction_seconds_;
  prometheus::Family<prometheus::Counter>& comm_seconds_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Gauge>& state_bytes_;
  prometheus::Family<prometheus::Gauge>& resident_bytes_;
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_METRICS_H_
