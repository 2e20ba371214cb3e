// Supervision against in-process fake workers: a failed step or a dead
// worker puts a job in RECOVERING; it is placed again (on its workers once
// they are back, else on others after the replacement timeout), restored
// and finishes; a job that spends its restarts fails listing every cause;
// each job has one supervisor thread from admission to its end.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "controller/testing/harness.h"

namespace baton {
namespace {

using testing::ControllerHarness;
using testing::HarnessOptions;
using testing::MlpJob;
using testing::WaitFor;

std::set<std::string> Workers(const baton::v1::JobStatus& s) { return {s.workers().begin(), s.workers().end()}; }

// The threads of this process named as a job's supervisor names its own.
int JobThreads() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    n += name == "baton-job";
  }
  return n;
}

// One owner for a job's life: a thread per job that has not ended, from
// admission (queued, waiting for workers) through its placements to its
// end, and none once it ended. A queued job stopped ends at once, its
// thread with it.
TEST(SupervisionTest, EachJobHasOneThreadFromAdmissionToItsEndAndNoneAfter) {
  ControllerHarness h{HarnessOptions()};
  testing::SlowSteps(h, absl::Milliseconds(50));
  const int before = JobThreads();
  auto a = h.jobs().Submit(MlpJob("a", 30));
  auto b = h.jobs().Submit(MlpJob("b", 30));
  auto queued = h.jobs().Submit(MlpJob("queued", 30));  // 4 workers: it waits
  ASSERT_TRUE(a.ok() && b.ok() && queued.ok());
  ASSERT_TRUE(WaitFor([&] { return (*a)->state() == baton::v1::JOB_RUNNING && (*b)->state() == baton::v1::JOB_RUNNING; }));
  const int live = JobThreads() - before;
  const baton::v1::JobState waiting = (*queued)->state();
  auto stopped = h.jobs().Stop((*queued)->id(), "not needed");
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_TRUE(WaitFor([&] { return (*a)->ended() && (*b)->ended(); }, absl::Seconds(30)));
  h.jobs().Tick(absl::Now());  // joins the threads of ended jobs
  ASSERT_TRUE(WaitFor([&] {
    h.jobs().Tick(absl::Now());
    return JobThreads() == before;
  }));
  std::printf("3 jobs admitted, 2 running and 1 queued: %d job threads; the queued one stopped: %s (%s); "
              "all ended: %d job threads\n",
              live, baton::v1::JobState_Name(stopped->state()).c_str(), stopped->error().c_str(), JobThreads() - before);
  EXPECT_EQ(live, 3);
  EXPECT_EQ(waiting, baton::v1::JOB_PENDING);
  EXPECT_EQ(stopped->state(), baton::v1::JOB_STOPPED);
  EXPECT_EQ(stopped->error(), "not needed");
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ((*b)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 4u);
}

TEST(SupervisionTest, AFailedStepRestartsTheJobOnItsWorkersAndItFinishes) {
  ControllerHarness h{HarnessOptions()};
  testing::FakeScript once;
  once.fail_at_step = 3;
  once.fail_times = 1;
  h.worker(1).set_script(once);
  auto job = h.jobs().Submit(MlpJob("restarted", 8, "workers: [\"fake-0\", \"fake-1\"] mesh { name: \"dp\" size: 2 } "
                                                    "restart { backoff_ms: 50 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  const baton::v1::JobStatus s = (*job)->status();
  std::printf("%s after %d restart (%d allowed): failures [%s]; recovering events %zu\n",
              baton::v1::JobState_Name(s.state()).c_str(), s.restarts(), (*job)->restarts_allowed(),
              s.failures_size() ? s.failures(0).cause().c_str() : "", h.EventsOf(baton::v1::Event::JOB_RECOVERING).size());
  EXPECT_EQ(s.state(), baton::v1::JOB_FINISHED) << s.error();
  EXPECT_EQ(s.step(), 8);
  EXPECT_EQ(s.restarts(), 1);
  ASSERT_EQ(s.failures_size(), 1);
  EXPECT_TRUE(absl::StrContains(s.failures(0).cause(), "injected failure at step 3"));
  EXPECT_EQ(s.failures(0).step(), 2);
  EXPECT_EQ(h.EventsOf(baton::v1::Event::JOB_RECOVERING).size(), 1u);
  EXPECT_EQ((*job)->restarts_allowed(), 3) << "a detached job's default";
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 4u);
}

TEST(SupervisionTest, PastItsRestartsAJobFailsListingEveryCauseWithItsTime) {
  ControllerHarness h{HarnessOptions()};
  testing::FakeScript always;
  always.fail_at_step = 3;
  h.worker(0).set_script(always);
  auto job = h.jobs().Submit(MlpJob("budget", 8, "workers: [\"fake-0\", \"fake-1\"] mesh { name: \"dp\" size: 2 } "
                                                 "restart { max_restarts: 2 backoff_ms: 20 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  const baton::v1::JobStatus s = (*job)->status();
  std::printf("%s: %s\n", baton::v1::JobState_Name(s.state()).c_str(), s.error().c_str());
  EXPECT_EQ(s.state(), baton::v1::JOB_FAILED);
  EXPECT_EQ(s.restarts(), 2);
  EXPECT_EQ(s.failures_size(), 3);
  EXPECT_TRUE(absl::StrContains(s.error(), "3 failures (2 of 2 restarts used)")) << s.error();
  const std::vector<std::string> lines = absl::StrSplit(s.error(), '\n');
  int causes = 0;
  for (const auto& line : lines) causes += absl::StrContains(line, "at step 2: ") && absl::StrContains(line, "injected");
  EXPECT_EQ(causes, 3) << s.error();
  EXPECT_EQ(h.EventsOf(baton::v1::Event::JOB_RECOVERING).size(), 2u);
}

TEST(SupervisionTest, AJobWaitsForItsDeadWorkersReplacementThenTakesOthers) {
  ControllerHarness h{HarnessOptions()};
  testing::SlowSteps(h, absl::Milliseconds(5));
  auto job = h.jobs().Submit(MlpJob("replaced", 300, "mesh { name: \"dp\" size: 2 } "
                                                    "restart { backoff_ms: 20 replacement_timeout_ms: 3000 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() >= 3; }));
  const std::set<std::string> before = Workers((*job)->status());
  const std::string victim = (*job)->status().workers(1);
  for (int i = 0; i < 4; ++i) {
    if (h.worker(i).name() == victim) h.worker(i).Kill();
  }
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return (*job)->state() == baton::v1::JOB_RECOVERING; }));
  // Waiting for the dead one's name: not placed on the free workers yet.
  absl::SleepFor(absl::Milliseconds(300));
  const baton::v1::JobState waiting = (*job)->state();
  ASSERT_TRUE(WaitFor([&] { return (*job)->state() == baton::v1::JOB_RUNNING; }));
  const double placed_s = absl::ToDoubleSeconds(absl::Now() - killed);
  const std::set<std::string> after = Workers((*job)->status());
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  std::printf("%s killed: %s 0.3 s later, running again %.2f s after the kill (replacement timeout 3 s) on [%s] "
              "instead of [%s]; %s at step %d\n",
              victim.c_str(), baton::v1::JobState_Name(waiting).c_str(), placed_s, absl::StrJoin(after, ",").c_str(),
              absl::StrJoin(before, ",").c_str(), baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->step());
  EXPECT_EQ(waiting, baton::v1::JOB_RECOVERING);
  EXPECT_GE(placed_s, 2.5);
  EXPECT_FALSE(after.count(victim));
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FINISHED) << (*job)->status().error();
  EXPECT_EQ((*job)->step(), 300);
}

TEST(SupervisionTest, TooFewWorkersLeftShrinkTheDataParallelAxisDownToMinWorkers) {
  ControllerHarness h{HarnessOptions()};
  testing::SlowSteps(h, absl::Milliseconds(5));
  auto job = h.jobs().Submit(MlpJob("shrinks", 400, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP } "
                                                    "restart { min_workers: 2 backoff_ms: 20 replacement_timeout_ms: 200 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() >= 3; }));
  h.worker(2).Kill();
  // 3 left: the global batch of 8 does not split over 3 replicas, so dp=2.
  ASSERT_TRUE(WaitFor([&] { return (*job)->state() == baton::v1::JOB_RUNNING && (*job)->status().workers_size() == 2; }));
  const baton::v1::JobStatus shrunk = (*job)->status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }, absl::Seconds(30)));
  std::string detail;
  for (const auto& e : h.EventsOf(baton::v1::Event::JOB_RECOVERING)) {
    if (absl::StrContains(e.detail(), "shrunk")) detail = e.detail();
  }
  std::printf("fake-2 killed: running on %d workers (mesh dp=%d, %d needed): %s; %s at step %d\n", shrunk.workers_size(),
              shrunk.mesh(0).size(), shrunk.workers_needed(), detail.c_str(),
              baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->step());
  EXPECT_EQ(shrunk.mesh(0).size(), 2);
  EXPECT_TRUE(absl::StrContains(detail, "shrunk onto 2 of its 4 workers (dp=2 instead of 4)")) << detail;
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FINISHED) << (*job)->status().error();
  EXPECT_EQ((*job)->step(), 400);
}

TEST(SupervisionTest, AJobThatMayNotShrinkWaitsForWorkers) {
  ControllerHarness h{HarnessOptions()};
  testing::SlowSteps(h, absl::Milliseconds(5));
  auto job = h.jobs().Submit(MlpJob("waits", 400, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP } "
                                                  "restart { backoff_ms: 20 replacement_timeout_ms: 200 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() >= 3; }));
  h.worker(2).Kill();
  ASSERT_TRUE(WaitFor([&] { return (*job)->state() == baton::v1::JOB_RECOVERING; }));
  absl::SleepFor(absl::Seconds(1));
  const baton::v1::JobStatus s = (*job)->status();
  std::printf("no min_workers: %s after 1 s, waiting for: %s\n", baton::v1::JobState_Name(s.state()).c_str(),
              s.waiting_for().c_str());
  EXPECT_EQ(s.state(), baton::v1::JOB_RECOVERING);
  EXPECT_EQ(s.mesh(0).size(), 4);
  h.jobs().Stop((*job)->id(), "test over").IgnoreError();
}

// A failure is counted and the job RECOVERING in one update: a client that
// sees the failure never sees the job RUNNING on the mesh it lost (a test
// that waited for "running again" took that for the restart and killed a
// replacement the job never ran on).
TEST(SupervisionTest, AFailureAndItsRecoveringStateAreOneUpdate) {
  baton::v1::JobRecord record;
  record.mutable_spec()->mutable_restart()->set_max_restarts(1);
  record.mutable_status()->set_job_id("j");
  record.mutable_status()->set_detached(true);
  record.mutable_status()->set_state(baton::v1::JOB_RUNNING);
  record.mutable_status()->set_step(7);
  Job job(record, std::make_shared<const JobPlan>());
  EXPECT_TRUE(job.NoteFailure("worker-1 unreachable"));
  baton::v1::JobStatus s = job.status();
  std::printf("after the first failure: %s, %d failure(s), %d restart(s)\n", baton::v1::JobState_Name(s.state()).c_str(),
              s.failures_size(), s.restarts());
  EXPECT_EQ(s.state(), baton::v1::JOB_RECOVERING);
  EXPECT_EQ(s.restarts(), 1);
  ASSERT_EQ(s.failures_size(), 1);
  EXPECT_EQ(s.failures(0).step(), 7);
  // Past its restarts: recorded, and ending it is its runner's (after it
  // freed the workers).
  ASSERT_TRUE(job.Enter(baton::v1::JOB_RUNNING));
  EXPECT_FALSE(job.NoteFailure("worker-1 unreachable again"));
  s = job.status();
  EXPECT_EQ(s.failures_size(), 2);
  EXPECT_EQ(s.restarts(), 1);
}

// StragglerPolicy EVICT: the rank whose compute is 25 % above its peers' is
// named with its worker and factor, the job moves off that worker between
// steps (shrunk onto the others, RestartPolicy.min_workers) without a
// failure counted, keeps off it for evict_ms, then grows back onto its
// whole mesh (the same worker, no longer slow) and finishes.
TEST(SupervisionTest, ARankNamedSlowIsEvictedAndTheJobGrowsBack) {
  ControllerHarness h{HarnessOptions()};
  testing::FakeScript normal;
  normal.step_delay = absl::Milliseconds(5);
  normal.compute_ms = 10;
  testing::FakeScript slow = normal;
  slow.compute_ms = 12.5;
  for (int i = 0; i < 4; ++i) h.worker(i).set_script(i == 2 ? slow : normal);
  auto job = h.jobs().Submit(MlpJob("evicts", 400, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP } "
                                                   "restart { min_workers: 2 backoff_ms: 20 } "
                                                   "straggler { window: 10 action: EVICT evict_ms: 1500 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  std::set<std::string> without;  // the workers it went on with
  ASSERT_TRUE(WaitFor([&] {
    const baton::v1::JobStatus s = (*job)->status();
    if (s.state() != baton::v1::JOB_RUNNING || s.stragglers_size() == 0 || s.workers_size() != 2) return false;
    without = Workers(s);
    return true;
  }));
  const absl::Time evicted = absl::Now();
  // No longer slow: once the job may use fake-2 again it grows back onto
  // it and stays. (Fakes keep no state: each placement restarts the job.)
  h.worker(2).set_script(normal);
  ASSERT_TRUE(WaitFor([&] {
    const baton::v1::JobStatus s = (*job)->status();
    return s.state() == baton::v1::JOB_RUNNING && s.workers_size() == 4;
  }));
  const double back_after = absl::ToDoubleSeconds(absl::Now() - evicted);
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }, absl::Seconds(30)));
  const baton::v1::JobStatus s = (*job)->status();
  ASSERT_GE(s.stragglers_size(), 1);
  const baton::v1::Straggler& first = s.stragglers(0);
  std::printf("named: rank %d on %s at step %d, %.3fx its peers (evicted %d); went on with [%s]; back on 4 "
              "workers %.1f s later; %s at step %d with %d restarts, %d STRAGGLER events\n",
              first.rank(), first.worker().c_str(), first.step(), first.factor(), first.evicted(),
              absl::StrJoin(without, ",").c_str(), back_after, baton::v1::JobState_Name(s.state()).c_str(), s.step(),
              s.restarts(), static_cast<int>(h.EventsOf(baton::v1::Event::STRAGGLER).size()));
  EXPECT_EQ(first.worker(), "fake-2");
  EXPECT_EQ(first.rank(), 2);
  EXPECT_NEAR(first.factor(), 1.25, 1e-6);
  EXPECT_TRUE(first.evicted());
  EXPECT_EQ(first.step(), 10) << "named at its first full window";
  EXPECT_EQ(without.count("fake-2"), 0u);
  EXPECT_GE(back_after, 1.0) << "kept off fake-2 for evict_ms";
  EXPECT_EQ(s.state(), baton::v1::JOB_FINISHED) << s.error();
  EXPECT_EQ(s.step(), 400);
  EXPECT_EQ(s.restarts(), 0) << "an eviction is no failure";
  EXPECT_EQ(s.stragglers_size(), 1) << "named once: fake-2 was no longer slow when the job came back to it";
  EXPECT_EQ(h.EventsOf(baton::v1::Event::STRAGGLER).size(), 1u);
}

}  // namespace
}  // namespace baton
