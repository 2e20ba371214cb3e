// JobManager against in-process fake workers (no daemon): jobs on disjoint
// sub-meshes, the first-come-first-served queue, stops, deaths and failures
// that touch one job only, named slices, placements tried again. Every case
// prints the figures it asserts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/controller_service.h"
#include "controller/fleet_checks.h"
#include "controller/testing/harness.h"

namespace baton {
namespace {

using testing::ControllerHarness;
using testing::HarnessOptions;
using testing::InState;
using testing::MlpJob;
using testing::SlowSteps;
using testing::WaitFor;
using testing::WorkersOf;

TEST(JobManagerTest, TwoDetachedJobsRunOnDisjointWorkers) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(200));  // both run 2 s: seen running together on a slow machine too
  auto a = h.jobs().Submit(MlpJob("a", 10));
  auto b = h.jobs().Submit(MlpJob("b", 10));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(WaitFor([&] { return InState(*a, baton::v1::JOB_RUNNING) && InState(*b, baton::v1::JOB_RUNNING); }));
  const auto wa = WorkersOf((*a)->status()), wb = WorkersOf((*b)->status());
  std::printf("%s on [%s], %s on [%s]\n", (*a)->id().c_str(), absl::StrJoin(wa, ",").c_str(), (*b)->id().c_str(),
              absl::StrJoin(wb, ",").c_str());
  ASSERT_EQ(wa.size(), 2u);
  ASSERT_EQ(wb.size(), 2u);
  for (const auto& w : wa) EXPECT_EQ(wb.count(w), 0u) << w << " serves both";
  EXPECT_EQ(h.meshes().Meshes().size(), 2u);
  ASSERT_TRUE(WaitFor([&] { return (*a)->ended() && (*b)->ended(); }));
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FINISHED) << (*a)->status().error();
  EXPECT_EQ((*b)->state(), baton::v1::JOB_FINISHED) << (*b)->status().error();
  EXPECT_EQ((*a)->step(), 10);
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 4u);
}

TEST(JobManagerTest, AThirdAttachedJobIsRefusedNamingNeededAndFree) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(50));
  auto a = h.jobs().Submit(MlpJob("a", 1000));
  auto b = h.jobs().Submit(MlpJob("b", 1000));
  ASSERT_TRUE(WaitFor([&] { return h.meshes().FreeWorkers().empty(); }));
  auto c = h.jobs().Create(MlpJob("c", 5), absl::Now() + absl::Seconds(5));
  std::printf("third job: %s\n", c.status().ToString().c_str());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "needs 2 workers but 0 of 4 registered are free"));
  EXPECT_EQ(h.jobs().Jobs().size(), 2u) << "a refused job leaves no record";
}

TEST(JobManagerTest, AThirdDetachedJobWaitsAndStartsWhenOneFinishes) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(200));  // a runs 1 s: c is seen waiting on a slow machine too
  auto a = h.jobs().Submit(MlpJob("a", 5));
  auto b = h.jobs().Submit(MlpJob("b", 200));
  auto c = h.jobs().Submit(MlpJob("c", 5));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(WaitFor([&] { return InState(*a, baton::v1::JOB_RUNNING) && InState(*b, baton::v1::JOB_RUNNING); }));
  const baton::v1::JobStatus pending = (*c)->status();
  std::printf("%s while both run: %s, waiting for: %s\n", pending.job_id().c_str(),
              baton::v1::JobState_Name(pending.state()).c_str(), pending.waiting_for().c_str());
  EXPECT_EQ(pending.state(), baton::v1::JOB_PENDING);
  EXPECT_TRUE(absl::StrContains(pending.waiting_for(), "needs 2 workers")) << pending.waiting_for();
  ASSERT_TRUE(WaitFor([&] { return (*c)->ended(); }));
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ((*c)->state(), baton::v1::JOB_FINISHED) << (*c)->status().error();
  EXPECT_EQ(WorkersOf((*c)->status()).size(), 0u) << "off its workers once ended";
  h.jobs().Stop((*b)->id(), "test over").IgnoreError();
}

TEST(JobManagerTest, TheQueueIsFirstComeFirstServed) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(100));
  auto a = h.jobs().Submit(MlpJob("a", 20));  // 2 of 4 workers, for 2 s
  ASSERT_TRUE(WaitFor([&] { return InState(*a, baton::v1::JOB_RUNNING); }));
  auto wide = h.jobs().Submit(MlpJob("wide", 3, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP }"));
  auto narrow = h.jobs().Submit(MlpJob("narrow", 3));
  absl::SleepFor(absl::Milliseconds(300));
  std::printf("with 2 free: wide %s, narrow %s\n", baton::v1::JobState_Name((*wide)->state()).c_str(),
              baton::v1::JobState_Name((*narrow)->state()).c_str());
  EXPECT_EQ((*wide)->state(), baton::v1::JOB_PENDING);
  EXPECT_EQ((*narrow)->state(), baton::v1::JOB_PENDING) << "it does not overtake the job ahead of it";
  ASSERT_TRUE(WaitFor([&] { return (*narrow)->ended(); }, absl::Seconds(20)));
  EXPECT_GT((*narrow)->status().started_unix_ms(), 0);
  EXPECT_GE((*narrow)->status().started_unix_ms(), (*wide)->status().started_unix_ms());
  EXPECT_EQ((*wide)->state(), baton::v1::JOB_FINISHED);
}

TEST(JobManagerTest, StoppingOneJobLeavesTheOtherRunning) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
  auto a = h.jobs().Submit(MlpJob("a", 1000));
  auto b = h.jobs().Submit(MlpJob("b", 30));
  ASSERT_TRUE(WaitFor([&] { return (*a)->step() >= 2 && (*b)->step() >= 2; }));
  const std::string b_mesh = (*b)->status().mesh_id();
  auto stopped = h.jobs().Stop((*a)->id(), "asked by the test");
  ASSERT_TRUE(stopped.ok());
  std::printf("%s %s at step %d: %s\n", stopped->job_id().c_str(), baton::v1::JobState_Name(stopped->state()).c_str(),
              stopped->step(), stopped->error().c_str());
  EXPECT_EQ(stopped->state(), baton::v1::JOB_STOPPED);
  EXPECT_EQ(stopped->error(), "asked by the test");
  ASSERT_TRUE(WaitFor([&] { return (*b)->ended(); }));
  EXPECT_EQ((*b)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ((*b)->step(), 30);
  for (const auto& e : h.EventsOf(baton::v1::Event::MESH_ABORTED)) {
    // Released when it finished; never before.
    if (e.mesh_id() == b_mesh) {
      EXPECT_EQ(e.cause(), absl::StrCat("job ", (*b)->id(), " JOB_FINISHED"));
    }
  }
}

TEST(JobManagerTest, AWorkerDeathFailsItsJobOnlyNamingTheWorker) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
  auto a = h.jobs().Submit(MlpJob("a", 1000, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } restart { max_restarts: 0 }"));
  auto b = h.jobs().Submit(MlpJob("b", 40));
  ASSERT_TRUE(WaitFor([&] { return (*a)->step() >= 2 && (*b)->step() >= 2; }));
  const std::string victim = (*a)->status().workers(1);
  const absl::Time killed = absl::Now();
  for (int i = 0; i < 4; ++i) {
    if (h.worker(i).name() == victim) h.worker(i).Kill();
  }
  ASSERT_TRUE(WaitFor([&] { return (*a)->ended(); }));
  std::printf("%s FAILED %.2f s after %s was killed: %s\n", (*a)->id().c_str(),
              absl::ToDoubleSeconds(absl::Now() - killed), victim.c_str(), (*a)->status().error().c_str());
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains((*a)->status().error(), victim)) << (*a)->status().error();
  ASSERT_TRUE(WaitFor([&] { return (*b)->ended(); }));
  EXPECT_EQ((*b)->state(), baton::v1::JOB_FINISHED) << (*b)->status().error();
}

TEST(JobManagerTest, AnInjectedStepFailureEndsTheJobAndFreesItsWorkers) {
  ControllerHarness h({});
  testing::FakeScript script;
  script.fail_at_step = 3;
  h.worker(1).set_script(script);
  auto a = h.jobs().Submit(MlpJob("a", 10));
  ASSERT_TRUE(WaitFor([&] { return (*a)->ended(); }));
  std::printf("%s at step %d: %s\n", baton::v1::JobState_Name((*a)->state()).c_str(), (*a)->step(),
              (*a)->status().error().c_str());
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FAILED);
  EXPECT_EQ((*a)->step(), 2) << "the failed step is not counted";
  EXPECT_TRUE(absl::StrContains((*a)->status().error(), "fake-1 (rank 1"));
  EXPECT_TRUE(absl::StrContains((*a)->status().error(), "injected failure at step 3"));
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 4u);
}

TEST(JobManagerTest, StoppingAPendingJobLetsTheNextOneIn) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
  auto a = h.jobs().Submit(MlpJob("a", 1000, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP }"));
  ASSERT_TRUE(WaitFor([&] { return InState(*a, baton::v1::JOB_RUNNING); }));
  auto wide = h.jobs().Submit(MlpJob("wide", 3, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP }"));
  auto stopped = h.jobs().Stop((*wide)->id(), "not needed");
  ASSERT_TRUE(stopped.ok());
  std::printf("pending job stopped: %s\n", baton::v1::JobState_Name(stopped->state()).c_str());
  EXPECT_EQ(stopped->state(), baton::v1::JOB_STOPPED);
  EXPECT_EQ(stopped->started_unix_ms(), 0) << "never placed";
  h.jobs().Stop((*a)->id(), "test over").IgnoreError();
}

TEST(JobManagerTest, ANamedSliceRunsExactlyThere) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
  auto job = h.jobs().Create(MlpJob("slice", 50, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                 "workers: \"fake-3\" workers: \"fake-1\""),
                             absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  std::printf("named [fake-3, fake-1]: placed on [%s]\n", absl::StrJoin((*job)->status().workers(), ", ").c_str());
  EXPECT_EQ((*job)->status().workers(0), "fake-3");
  EXPECT_EQ((*job)->status().workers(1), "fake-1");
  auto clash = h.jobs().Create(MlpJob("clash", 5, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                  "workers: \"fake-0\" workers: \"fake-1\""),
                               absl::Now() + absl::Seconds(5));
  std::printf("naming a held worker: %s\n", clash.status().ToString().c_str());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(clash.status().message(), "fake-1 is held by " + (*job)->id()));
}

TEST(JobManagerTest, APlacementTheFleetSpoiledIsTriedAgain) {
  HarnessOptions options;
  options.jobs.retry_backoff = absl::Milliseconds(100);
  ControllerHarness h(options);
  testing::FakeScript broken;
  broken.configure_error = grpc::StatusCode::UNAVAILABLE;
  h.worker(0).set_script(broken);
  auto job = h.jobs().Submit(MlpJob("retry", 3));
  ASSERT_TRUE(WaitFor([&] { return h.worker(0).configures() >= 2; }));
  std::printf("Configure refused %d times; job %s (%s)\n", h.worker(0).configures(),
              baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->status().waiting_for().c_str());
  EXPECT_FALSE((*job)->ended());
  h.worker(0).set_script({});
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FINISHED) << (*job)->status().error();
}

}  // namespace
}  // namespace baton
