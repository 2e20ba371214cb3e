// The controller's /metrics: every job and mesh of a snapshot gets its
// series, and a job's series go once it ended longer ago than the bound.
#include "controller/controller_metrics.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/metrics.h"

namespace baton {
namespace {

baton::v1::JobStatus JobAt(const std::string& id, baton::v1::JobState state, int64_t ended_ms_ago) {
  baton::v1::JobStatus j;
  j.set_job_id(id);
  j.set_name(id + "-name");
  j.set_state(state);
  j.set_step(3);
  j.set_steps(10);
  if (ended_ms_ago >= 0) j.set_ended_unix_ms(absl::ToUnixMillis(absl::Now()) - ended_ms_ago);
  return j;
}

TEST(ControllerMetricsTest, EveryJobAndMeshHasSeriesAndEndedJobsAreRetired) {
  ControllerMetrics metrics(absl::Minutes(10));
  baton::v1::StatusResponse status;
  *status.add_jobs() = JobAt("job-1", baton::v1::JOB_RUNNING, -1);
  *status.add_jobs() = JobAt("job-2", baton::v1::JOB_FINISHED, 1000);            // a second ago
  *status.add_jobs() = JobAt("job-3", baton::v1::JOB_FAILED, 11 * 60 * 1000);    // eleven minutes ago
  baton::v1::Mesh* mesh = status.add_meshes();
  mesh->set_mesh_id("mesh-7");
  mesh->set_job_id("job-1");
  mesh->add_worker_names("w-0");
  mesh->add_worker_names("w-1");
  for (const auto& j : status.jobs()) {
    baton::v1::StepMetrics m;
    m.set_step_ms(10);
    m.set_tokens(4);
    metrics.ObserveStep(j, m, 100);
  }
  metrics.Refresh(status);
  const std::string text = MetricsResponse(metrics.registry()).body;
  auto has = [&](const std::string& s) { return absl::StrContains(text, s); };
  std::printf("series: job-1 %d, job-2 %d, job-3 %d; mesh-7 ranks %d; jobs by state RUNNING %d\n",
              has("job_id=\"job-1\""), has("job_id=\"job-2\""), has("job_id=\"job-3\""),
              has("baton_mesh_ranks{job_id=\"job-1\",mesh_id=\"mesh-7\"} 2"), has("baton_jobs{state=\"JOB_RUNNING\"} 1"));
  EXPECT_TRUE(has("baton_job_step{job_id=\"job-1\",job_name=\"job-1-name\"} 3"));
  EXPECT_TRUE(has("job_id=\"job-2\""));
  EXPECT_FALSE(has("job_id=\"job-3\"")) << "a job ended 11 minutes ago keeps series:\n" << text;
  EXPECT_TRUE(has("baton_mesh_ranks{job_id=\"job-1\",mesh_id=\"mesh-7\"} 2"));
  EXPECT_TRUE(has("baton_jobs{state=\"JOB_FAILED\"} 1"));
  // The mesh goes: so does its series.
  status.clear_meshes();
  metrics.Refresh(status);
  EXPECT_FALSE(absl::StrContains(MetricsResponse(metrics.registry()).body, "mesh-7"));
}

}  // namespace
}  // namespace baton
