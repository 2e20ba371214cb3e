#include "worker/worker_metrics.h"

#include "common/metrics.h"
#include "common/process.h"

namespace baton {

WorkerMetrics::WorkerMetrics()
    : rpc_durations_(registry_),
      steps_(prometheus::BuildCounter()
                 .Name("baton_worker_steps_total")
                 .Help("Training steps this worker completed, by job")
                 .Register(registry_)),
      failed_steps_(prometheus::BuildCounter()
                        .Name("baton_worker_failed_steps_total")
                        .Help("Training steps that failed on this worker, by job")
                        .Register(registry_)),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("baton_worker_step_duration_seconds")
                        .Help("Time this worker spent on one step")
                        .Register(registry_)),
      comm_bytes_(prometheus::BuildCounter()
                      .Name("baton_comm_bytes_total")
                      .Help("Bytes this worker sent to other ranks during steps, by job and collective")
                      .Register(registry_)),
      instruction_seconds_(prometheus::BuildCounter()
                               .Name("baton_instruction_seconds_total")
                               .Help("Time spent executing Program instructions, by instruction kind")
                               .Register(registry_)),
      comm_seconds_(prometheus::BuildCounter()
                        .Name("baton_worker_comm_seconds_total")
                        .Help("Communication time during steps, by job: waited (exposed: the computing thread "
                              "blocked on it) and in_flight (every operation from issue to completion)")
                        .Register(registry_)),
      tokens_(prometheus::BuildCounter()
                  .Name("baton_worker_tokens_total")
                  .Help("Tokens (or rows) this worker's rank processed, by job")
                  .Register(registry_)),
      state_bytes_(prometheus::BuildGauge()
                       .Name("baton_worker_state_bytes")
                       .Help("Parameters, gradients and optimizer state held by this worker's rank")
                       .Register(registry_)),
      resident_bytes_(prometheus::BuildGauge()
                          .Name("process_resident_memory_bytes")
                          .Help("Resident memory of the worker process")
                          .Register(registry_)) {}

void WorkerMetrics::ObserveStep(const std::string& job, const baton::v1::StepMetrics& m, const StepDetail& detail) {
  steps_.Add({{"job_id", job}}).Increment();
  step_seconds_.Add({{"job_id", job}}, DurationBuckets()).Observe(m.step_ms() / 1e3);
  tokens_.Add({{"job_id", job}}).Increment(static_cast<double>(m.tokens()));
  for (const auto& [collective, bytes] : detail.comm_bytes_by_collective) {
    comm_bytes_.Add({{"job_id", job}, {"collective", collective}}).Increment(static_cast<double>(bytes));
  }
  for (const auto& [instruction, seconds] : detail.instruction_seconds) {
    instruction_seconds_.Add({{"instruction", instruction}}).Increment(seconds);
  }
  comm_seconds_.Add({{"job_id", job}, {"kind", "waited"}}).Increment(m.comm_wait_ms() / 1e3);
  comm_seconds_.Add({{"job_id", job}, {"kind", "in_flight"}}).Increment(m.comm_ms() / 1e3);
  state_bytes_.Add({}).Set(static_cast<double>(m.state_bytes()));
}

void WorkerMetrics::ObserveFailedStep(const std::string& job) { failed_steps_.Add({{"job_id", job}}).Increment(); }

void WorkerMetrics::ObserveStepChannelCall(grpc::StatusCode code, double seconds) {
  rpc_durations_.Observe("/baton.v1.Worker/RunStep", code, "step_channel", seconds);
}

void WorkerMetrics::Refresh() { resident_bytes_.Add({}).Set(static_cast<double>(ReadProcessMemory().resident)); }

}  // namespace baton
