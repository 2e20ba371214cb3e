#include "controller/controller_metrics.h"

#include <set>

#include "absl/time/clock.h"

#include "common/metrics.h"
#include "proto/mesh.pb.h"

namespace baton {
namespace {

template <typename T>
prometheus::Family<T>& Build(prometheus::detail::Builder<T> builder, const char* name, const char* help,
                             prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

prometheus::Labels JobLabels(const baton::v1::JobStatus& job) {
  return {{"job_id", job.job_id()}, {"job_name", job.name()}};
}

}  // namespace

ControllerMetrics::ControllerMetrics(absl::Duration retire_after)
    : retire_after_(retire_after),
      workers_(Build(prometheus::BuildGauge(), "baton_workers", "Workers known to the controller, by state",
                     registry_)),
      worker_up_(Build(prometheus::BuildGauge(), "baton_worker_up", "1 while the worker heartbeats, 0 when DEAD",
                       registry_)),
      heartbeat_age_(Build(prometheus::BuildGauge(), "baton_worker_heartbeat_age_seconds",
                           "Time since the worker's last heartbeat", registry_)),
      restarts_(Build(prometheus::BuildCounter(), "baton_worker_restarts_total",
                      "Times a worker's name came back as a new process", registry_)),
      meshes_(Build(prometheus::BuildGauge(), "baton_meshes", "Meshes formed now (a job's, or idle)", registry_)),
      mesh_ranks_(Build(prometheus::BuildGauge(), "baton_mesh_ranks", "Ranks of a formed mesh, by mesh_id and job_id",
                        registry_)),
      jobs_(Build(prometheus::BuildGauge(), "baton_jobs", "Jobs the controller knows, by state", registry_)),
      job_step_(Build(prometheus::BuildGauge(), "baton_job_step", "Steps the job has completed", registry_)),
      job_steps_(Build(prometheus::BuildGauge(), "baton_job_steps", "Steps the job was asked to run", registry_)),
      job_loss_(Build(prometheus::BuildGauge(), "baton_job_loss", "Loss of the job's last step", registry_)),
      job_tokens_per_second_(Build(prometheus::BuildGauge(), "baton_job_tokens_per_second",
                                   "Tokens per second of the job's last step", registry_)),
      job_tokens_(Build(prometheus::BuildCounter(), "baton_job_tokens_total", "Tokens the job has processed",
                        registry_)),
      job_comm_bytes_(Build(prometheus::BuildCounter(), "baton_job_comm_bytes_total",
                            "Bytes the job's ranks have sent to each other, all ranks together", registry_)),
      step_seconds_(Build(prometheus::BuildHistogram(), "baton_step_duration_seconds",
                          "Wall time of one training step as the controller saw it", registry_)),
      rank_compute_(Build(prometheus::BuildGauge(), "baton_rank_compute_seconds",
                          "The rank's own compute in the job's newest step (its waits on communication excluded)",
                          registry_)),
      rank_exposed_comm_(Build(prometheus::BuildGauge(), "baton_rank_exposed_comm_seconds",
                               "What the rank was blocked on communication in the job's newest step (not idle)",
                               registry_)),
      rank_idle_(Build(prometheus::BuildGauge(), "baton_rank_idle_seconds",
                       "What the rank waited for another pipeline stage in the job's newest step", registry_)) {}

void ControllerMetrics::ObserveStep(const baton::v1::JobStatus& job, const baton::v1::StepMetrics& merged,
                                    int64_t comm_bytes) {
  const prometheus::Labels labels = JobLabels(job);
  step_seconds_.Add(labels, DurationBuckets()).Observe(merged.step_ms() / 1e3);
  job_tokens_.Add(labels).Increment(static_cast<double>(merged.tokens()));
  job_comm_bytes_.Add(labels).Increment(static_cast<double>(comm_bytes));
}

void ControllerMetrics::Refresh(const baton::v1::StatusResponse& status) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int> by_state;
  for (int s = baton::v1::REGISTERED; s <= baton::v1::DEAD; ++s) {
    by_state[baton::v1::WorkerState_Name(static_cast<baton::v1::WorkerState>(s))] = 0;
  }
  std::set<std::string> listed;
  for (const auto& w : status.workers()) {
    ++by_state[baton::v1::WorkerState_Name(w.state())];
    listed.insert(w.name());
    WorkerSeries& series = worker_series_[w.name()];
    const prometheus::Labels labels{{"worker", w.name()}};
    if (series.up == nullptr) {
      series.up = &worker_up_.Add(labels);
      series.heartbeat_age = &heartbeat_age_.Add(labels);
      series.restarts = &restarts_.Add(labels);
    }
    series.up->Set(w.state() == baton::v1::DEAD ? 0 : 1);
    series.heartbeat_age->Set(w.heartbeat_age_s());
    if (w.restarts() > series.counted_restarts) {
      series.restarts->Increment(w.restarts() - series.counted_restarts);
      series.counted_restarts = w.restarts();
    }
  }
  for (auto it = worker_series_.begin(); it != worker_series_.end();) {
    if (listed.count(it->first)) {
      ++it;
      continue;
    }
    worker_up_.Remove(it->second.up);
    heartbeat_age_.Remove(it->second.heartbeat_age);
    restarts_.Remove(it->second.restarts);
    it = worker_series_.erase(it);
  }
  for (const auto& [state, n] : by_state) workers_.Add({{"state", state}}).Set(n);
  meshes_.Add({}).Set(status.meshes_size());
  std::set<std::string> formed;
  for (const auto& m : status.meshes()) {
    formed.insert(m.mesh_id());
    auto& series = mesh_series_[m.mesh_id()];
    if (series == nullptr) series = &mesh_ranks_.Add({{"mesh_id", m.mesh_id()}, {"job_id", m.job_id()}});
    series->Set(m.worker_names_size());
  }
  for (auto it = mesh_series_.begin(); it != mesh_series_.end();) {
    if (formed.count(it->first)) {
      ++it;
      continue;
    }
    mesh_ranks_.Remove(it->second);
    it = mesh_series_.erase(it);
  }
  std::map<std::string, int> jobs_by_state;
  for (int s = baton::v1::JOB_PENDING; s <= baton::v1::JOB_UNREADABLE; ++s) {
    jobs_by_state[baton::v1::JobState_Name(static_cast<baton::v1::JobState>(s))] = 0;
  }
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const auto& job : status.jobs()) {
    ++jobs_by_state[baton::v1::JobState_Name(job.state())];
    if (retired_.count(job.job_id())) continue;
    if (job.ended_unix_ms() > 0 && now_ms - job.ended_unix_ms() > absl::ToInt64Milliseconds(retire_after_)) {
      RetireJob(job);
      continue;
    }
    const prometheus::Labels labels = JobLabels(job);
    job_step_.Add(labels).Set(job.step());
    job_steps_.Add(labels).Set(job.steps());
    if (job.last().has_loss()) job_loss_.Add(labels).Set(job.last().loss());
    job_tokens_per_second_.Add(labels).Set(job.last().tokens_per_s());
    SetRankTimes(job, /*retire=*/false);
  }
  for (const auto& [state, n] : jobs_by_state) jobs_.Add({{"state", state}}).Set(n);
  // Forgotten jobs need no memory of having been retired.
  std::set<std::string> listed_jobs;
  for (const auto& job : status.jobs()) listed_jobs.insert(job.job_id());
  for (auto it = retired_.begin(); it != retired_.end();) it = listed_jobs.count(*it) ? std::next(it) : retired_.erase(it);
}

void ControllerMetrics::RetireJob(const baton::v1::JobStatus& job) {
  const prometheus::Labels labels = JobLabels(job);
  // Add returns the series of these labels (made now if it never was).
  job_step_.Remove(&job_step_.Add(labels));
  job_steps_.Remove(&job_steps_.Add(labels));
  job_loss_.Remove(&job_loss_.Add(labels));
  job_tokens_per_second_.Remove(&job_tokens_per_second_.Add(labels));
  job_tokens_.Remove(&job_tokens_.Add(labels));
  job_comm_bytes_.Remove(&job_comm_bytes_.Add(labels));
  step_seconds_.Remove(&step_seconds_.Add(labels, DurationBuckets()));
  SetRankTimes(job, /*retire=*/true);
  retired_.insert(job.job_id());
}

void ControllerMetrics::SetRankTimes(const baton::v1::JobStatus& job, bool retire) {
  auto with_rank = [&job](const RankLabels& rank) {
    prometheus::Labels labels = JobLabels(job);
    labels["rank"] = rank.first;
    labels["worker"] = rank.second;
    return labels;
  };
  std::set<RankLabels>& had = rank_series_[job.job_id()];
  std::set<RankLabels> has;
  if (!retire) {
    for (const baton::v1::RankTime& t : job.rank_times()) {
      const RankLabels rank{std::to_string(t.rank()), t.worker()};
      const prometheus::Labels labels = with_rank(rank);
      rank_compute_.Add(labels).Set(t.compute_ms() / 1e3);
      rank_exposed_comm_.Add(labels).Set(t.exposed_comm_ms() / 1e3);
      rank_idle_.Add(labels).Set(t.idle_ms() / 1e3);
      has.insert(rank);
    }
  }
  for (const RankLabels& rank : had) {
    if (has.count(rank)) continue;
    const prometheus::Labels labels = with_rank(rank);
    for (auto* family : {&rank_compute_, &rank_exposed_comm_, &rank_idle_}) family->Remove(&family->Add(labels));
  }
  if (has.empty()) {
    rank_series_.erase(job.job_id());
  } else {
    had = std::move(has);
  }
}

}  // namespace baton
