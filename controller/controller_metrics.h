// The controller's Prometheus metrics (GET /metrics): the fleet, every mesh,
// every job and its steps. Counters and histograms move as steps finish;
// the gauges are read from a status snapshot at each scrape. Jobs are
// labelled job_id and job_name (Prometheus keeps `job` for its scrape job);
// a job's series are retired `retire_after` after it ended, a mesh's when
// it is gone. Each rank's newest step, split into its own compute, its
// exposed communication and its pipeline idle time:
// baton_rank_compute_seconds, baton_rank_exposed_comm_seconds and
// baton_rank_idle_seconds, labelled also rank and worker.
#ifndef BATON_CONTROLLER_CONTROLLER_METRICS_H_
#define BATON_CONTROLLER_CONTROLLER_METRICS_H_

#include <map>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/controller.pb.h"

namespace baton {

class ControllerMetrics {
 public:
  explicit ControllerMetrics(absl::Duration retire_after = absl::Minutes(10));
  prometheus::Registry& registry() { return registry_; }

  // One finished step of `job`: `merged` as the controller reports it,
  // `comm_bytes` sent by all ranks together.
  void ObserveStep(const baton::v1::JobStatus& job, const baton::v1::StepMetrics& merged, int64_t comm_bytes);
  // Sets the fleet, mesh and job gauges from `status` (call before a
  // scrape) and retires the series of jobs that ended long enough ago.
  void Refresh(const baton::v1::StatusResponse& status);

 private:
  void RetireJob(const baton::v1::JobStatus& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // baton_rank_*_seconds of the job's newest step, by rank; the series of
  // ranks it no longer has (`times` empty: all) removed.
  void SetRankTimes(const baton::v1::JobStatus& job, bool retire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration retire_after_;
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& worker_up_;
  prometheus::Family<prometheus::Gauge>& heartbeat_age_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Gauge>& meshes_;
  prometheus::Family<prometheus::Gauge>& mesh_ranks_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& job_step_;
  prometheus::Family<prometheus::Gauge>& job_steps_;
  prometheus::Family<prometheus::Gauge>& job_loss_;
  prometheus::Family<prometheus::Gauge>& job_tokens_per_second_;
  prometheus::Family<prometheus::Counter>& job_tokens_;
  prometheus::Family<prometheus::Counter>& job_comm_bytes_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Gauge>& rank_compute_;
  prometheus::Family<prometheus::Gauge>& rank_exposed_comm_;
  prometheus::Family<prometheus::Gauge>& rank_idle_;

  absl::Mutex mu_;
  // Per-worker series, removed when the worker is forgotten.
  struct WorkerSeries {
    prometheus::Gauge* up = nullptr;
    prometheus::Gauge* heartbeat_age = nullptr;
    prometheus::Counter* restarts = nullptr;
    int counted_restarts = 0;
  };
  std::map<std::string, WorkerSeries> worker_series_ ABSL_GUARDED_BY(mu_);
  // Mesh series by mesh id; jobs whose series are retired.
  std::map<std::string, prometheus::Gauge*> mesh_series_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> retired_ ABSL_GUARDED_BY(mu_);
  // A job's rank series, by its rank and worker labels.
  using RankLabels = std::pair<std::string, std::string>;
  std::map<std::string, std::set<RankLabels>> rank_series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_CONTROLLER_METRICS_H_
