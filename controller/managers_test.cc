// The control plane's managers against in-process fake workers (no daemon):
// jobs on disjoint sub-meshes, the first-come-first-served queue, stops,
// aborts and deaths that touch one job only, leases, Step's deadline, the
// job table read back after a controller restart, and the bounds on what a
// client may send. Every case prints the figures it asserts.
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

using baton::v1::JobState;
using testing::ControllerHarness;
using testing::HarnessOptions;
using testing::MlpJob;
using testing::WaitFor;

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-XXXXXX");
  return mkdtemp(dir.data()) ? dir : "";
}

bool InState(const std::shared_ptr<Job>& job, JobState state) { return job->state() == state; }

std::set<std::string> WorkersOf(const baton::v1::JobStatus& s) { return {s.workers().begin(), s.workers().end()}; }

void SlowSteps(ControllerHarness& h, absl::Duration delay) {
  testing::FakeScript script;
  script.step_delay = delay;
  for (int i = 0; i < h.fleet().size(); ++i) h.worker(i).set_script(script);
}

TEST(JobManagerTest, TwoDetachedJobsRunOnDisjointWorkers) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
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
  SlowSteps(h, absl::Milliseconds(20));
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
  SlowSteps(h, absl::Milliseconds(20));
  auto a = h.jobs().Submit(MlpJob("a", 40));  // 2 of 4 workers
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
  auto a = h.jobs().Submit(MlpJob("a", 1000));
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

TEST(JobManagerTest, ALapsedLeaseStopsTheJobAndFreesItsWorkers) {
  HarnessOptions options;
  options.jobs.default_lease = absl::Milliseconds(300);
  ControllerHarness h(options);
  auto job = h.jobs().Create(MlpJob("leased", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  auto stepped = h.jobs().Step((*job)->id(), 2, 30000, absl::Now() + absl::Seconds(5), nullptr);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  const absl::Time last_call = absl::Now();
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 2u);
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  const double after = absl::ToDoubleSeconds(absl::Now() - last_call);
  std::printf("lease 300 ms: %s %.2f s after the last call (%s); free workers %zu\n",
              baton::v1::JobState_Name((*job)->state()).c_str(), after, (*job)->status().error().c_str(),
              h.meshes().FreeWorkers().size());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_STOPPED);
  EXPECT_TRUE(absl::StrContains((*job)->status().error(), "lease lapsed"));
  EXPECT_LT(after, 2.0);
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 4u);
  EXPECT_EQ((*job)->step(), 2);
}

TEST(JobManagerTest, CallsKeepTheLease) {
  HarnessOptions options;
  options.jobs.default_lease = absl::Milliseconds(300);
  ControllerHarness h(options);
  auto job = h.jobs().Create(MlpJob("kept", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok());
  for (int i = 0; i < 15; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(h.jobs().KeepAlive((*job)->id()).ok());
  }
  std::printf("after 1.5 s of KeepAlive every 100 ms (lease 300 ms): %s\n",
              baton::v1::JobState_Name((*job)->state()).c_str());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_RUNNING);
}

TEST(JobManagerTest, StepHonoursItsDeadlineAndTheRunningStepIsCountedOnce) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(1500));
  auto job = h.jobs().Create(MlpJob("slow", 10), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok());
  const absl::Time start = absl::Now();
  auto stepped = h.jobs().Step((*job)->id(), 3, 30000, start + absl::Milliseconds(300), nullptr);
  const double returned = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("Step(3) with a 0.3 s deadline, steps of 1.5 s: returned after %.2f s: %s\n", returned,
              stepped.status().ToString().c_str());
  EXPECT_EQ(stepped.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(returned, 1.0);
  // The step that was running completes and is counted; the two not
  // started are withdrawn.
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() == 1; }, absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(2000));
  int logged = 0;
  for (const auto& e : (*job)->log().After(0)) logged += e.has_step();
  std::printf("after it: step %d, %d step entries, %d RunSteps on rank 0\n", (*job)->step(), logged,
              h.worker(0).steps_run());
  EXPECT_EQ((*job)->step(), 1);
  EXPECT_EQ(logged, 1);
  EXPECT_EQ(h.worker(0).steps_run(), 1);
}

TEST(JobManagerTest, StepReturnsEveryMetricOnceAndTheLogAgrees) {
  ControllerHarness h({});
  auto job = h.jobs().Create(MlpJob("count", 10), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok());
  auto first = h.jobs().Step((*job)->id(), 3, 30000, absl::Now() + absl::Seconds(10), nullptr);
  auto second = h.jobs().Step((*job)->id(), 2, 30000, absl::Now() + absl::Seconds(10), nullptr);
  ASSERT_TRUE(first.ok() && second.ok());
  std::vector<int> steps;
  for (const auto& m : first->metrics) steps.push_back(m.step());
  for (const auto& m : second->metrics) steps.push_back(m.step());
  std::printf("steps answered: %s; job at %d\n", absl::StrJoin(steps, ",").c_str(), second->status.step());
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_DOUBLE_EQ(first->metrics[1].loss(), 10.0 / 2);
  EXPECT_EQ(second->status.step(), 5);
}

TEST(JobManagerTest, AnIdleAttachedJobWhoseWorkerDiesFails) {
  ControllerHarness h({});
  auto job = h.jobs().Create(MlpJob("idle", 10), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok());
  const std::string victim = (*job)->status().workers(0);
  for (int i = 0; i < 4; ++i) {
    if (h.worker(i).name() == victim) h.worker(i).Kill();
  }
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  std::printf("%s: %s\n", baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->status().error().c_str());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains((*job)->status().error(), victim + " (rank 0"));
  auto step = h.jobs().Step((*job)->id(), 1, 30000, absl::Now() + absl::Seconds(2), nullptr);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition) << step.status();
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

TEST(JobManagerTest, ACheckpointDirOutsideTheRootIsRefusedAtSubmit) {
  HarnessOptions options;
  options.jobs.checkpoints.file_root = TempDir("root");
  ControllerHarness h(options);
  for (const std::string dir : {"/etc/baton-ckpt", "../escape", "/nonexistent-root/ckpt"}) {
    auto job = h.jobs().Submit(MlpJob("ckpt", 3, absl::StrCat("mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                               "checkpoint { dir: \"", dir, "\" every_n_steps: 1 }")));
    std::printf("checkpoint.dir %s: %s\n", dir.c_str(), job.status().ToString().c_str());
    EXPECT_FALSE(job.ok());
    EXPECT_TRUE(absl::StrContains(job.status().message(), dir)) << job.status();
  }
  EXPECT_EQ(h.worker(0).configures(), 0) << "no worker was touched";
  EXPECT_TRUE(h.jobs().Jobs().empty());
}

TEST(JobManagerTest, SavesThatFailInARowFailTheJobNamingTheCause) {
  HarnessOptions options;
  options.jobs.checkpoints.file_root = TempDir("root");
  ControllerHarness h(options);
  testing::FakeScript full;
  full.fail_saves = true;
  for (int i = 0; i < 4; ++i) h.worker(i).set_script(full);
  auto job = h.jobs().Submit(MlpJob("full", 20, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                "checkpoint { dir: \"ckpt\" every_n_steps: 2 max_failures: 2 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  int errors = 0;
  for (const auto& e : (*job)->log().After(0)) errors += e.entry_case() == baton::v1::JobLogEntry::kCheckpointError;
  std::printf("%s at step %d after %d failed saves: %s\n", baton::v1::JobState_Name((*job)->state()).c_str(),
              (*job)->step(), errors, (*job)->status().error().c_str());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FAILED);
  EXPECT_EQ((*job)->step(), 4);
  EXPECT_EQ(errors, 2);
  EXPECT_TRUE(absl::StrContains((*job)->status().error(), "No space left on device"));
  // Nothing is left of the failed saves.
  std::ifstream probe(absl::StrCat(options.jobs.checkpoints.file_root, "/ckpt/step-00000002"));
  EXPECT_FALSE(probe.good()) << "the failed save's step directory is still there";
}

TEST(JobStoreTest, AJobTableReadBackAfterARestartResumesDetachedAndFailsAttached) {
  HarnessOptions options;
  options.state_dir = TempDir("state");
  std::string detached, attached, finished;
  int steps_before = 0;
  {
    ControllerHarness h(options);
    SlowSteps(h, absl::Milliseconds(30));
    auto done = h.jobs().Submit(MlpJob("done", 2));
    ASSERT_TRUE(WaitFor([&] { return (*done)->ended(); }));
    auto d = h.jobs().Submit(MlpJob("detached", 1000));
    auto a = h.jobs().Create(MlpJob("attached", 100), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(d.ok() && a.ok());
    ASSERT_TRUE(WaitFor([&] { return (*d)->step() >= 3; }));
    steps_before = (*d)->step();
    detached = (*d)->id();
    attached = (*a)->id();
    finished = (*done)->id();
  }  // the controller goes away, leaving its table
  ControllerHarness h(options);
  auto d = h.jobs().Find(detached);
  auto a = h.jobs().Find(attached);
  auto f = h.jobs().Find(finished);
  ASSERT_TRUE(d.ok() && a.ok() && f.ok());
  ASSERT_TRUE(WaitFor([&] { return (*d)->state() == baton::v1::JOB_RUNNING; }));
  int logged_steps = 0;
  for (const auto& e : (*f)->log().After(0)) logged_steps += e.has_step();
  std::printf("after the restart: %s %s (resumes %d, ran %d steps before), %s %s: %s; %s %s with %d logged steps\n",
              detached.c_str(), baton::v1::JobState_Name((*d)->state()).c_str(), (*d)->status().resumes(), steps_before,
              attached.c_str(), baton::v1::JobState_Name((*a)->state()).c_str(), (*a)->status().error().c_str(),
              finished.c_str(), baton::v1::JobState_Name((*f)->state()).c_str(), logged_steps);
  EXPECT_EQ((*d)->status().resumes(), 1);
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains((*a)->status().error(), "the controller restarted"));
  EXPECT_EQ((*f)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ(logged_steps, 2);
  EXPECT_EQ(h.EventsOf(baton::v1::Event::JOB_REQUEUED).size(), 1u);
  auto next = h.jobs().Submit(MlpJob("next", 1));
  ASSERT_TRUE(next.ok());
  std::printf("ids before the restart: %s %s %s; after: %s\n", finished.c_str(), detached.c_str(), attached.c_str(),
              (*next)->id().c_str());
  for (const auto& id : {finished, detached, attached}) EXPECT_NE((*next)->id(), id);
  h.jobs().Stop(detached, "test over").IgnoreError();
}

TEST(JobStoreTest, IdsAndEpochsNeverRepeatAcrossRestarts) {
  const std::string dir = TempDir("ids");
  std::set<std::string> ids;
  std::set<int64_t> epochs;
  for (int start = 0; start < 3; ++start) {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(ids.insert((*store)->NewJobId()).second);
      EXPECT_TRUE(epochs.insert((*store)->NewEpoch()).second);
    }
  }
  auto a = JobStore::InMemory(), b = JobStore::InMemory();
  const std::string ia = a->NewJobId(), ib = b->NewJobId();
  const int64_t ea = a->NewEpoch();
  absl::SleepFor(absl::Milliseconds(2));
  const int64_t eb = b->NewEpoch();
  std::printf("persisted ids %s; in memory %s and %s, epochs %lld < %lld\n", absl::StrJoin(ids, ",").c_str(), ia.c_str(),
              ib.c_str(), static_cast<long long>(ea), static_cast<long long>(eb));
  EXPECT_EQ(ids.size(), 9u);
  EXPECT_EQ(*ids.begin(), "job-1");
  EXPECT_NE(ia, ib);
  EXPECT_LT(ea, eb);
}

TEST(FleetTest, ACheckRunsOnFreeWorkersBesideARunningJob) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
  auto job = h.jobs().Submit(MlpJob("busy", 1000));
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() >= 1; }));
  baton::v1::CheckCollectivesRequest req;
  auto* axis = req.mutable_spec()->add_axes();
  axis->set_name("dp");
  axis->set_size(2);
  req.set_numel(16);
  auto checked = RunFleetCheck(h.meshes(), h.events(), req, "check-1");
  ASSERT_TRUE(checked.ok()) << checked.status();
  std::printf("check on [%s] beside %s on [%s]: %s\n", absl::StrJoin(checked->mesh().worker_names(), ", ").c_str(),
              (*job)->id().c_str(), absl::StrJoin((*job)->status().workers(), ", ").c_str(),
              checked->passed() ? "passed" : "FAILED");
  EXPECT_TRUE(checked->passed());
  for (const auto& w : checked->mesh().worker_names()) EXPECT_EQ(WorkersOf((*job)->status()).count(w), 0u);
  EXPECT_EQ((*job)->state(), baton::v1::JOB_RUNNING);
  const int before = (*job)->step();
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() > before + 2; }));
  // A job may take the idle mesh's workers.
  auto other = h.jobs().Create(MlpJob("next", 3), absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(other.ok()) << other.status();
  h.jobs().Stop((*job)->id(), "test over").IgnoreError();
}

TEST(ControllerServiceTest, HostileIdsAreRefusedWithABoundedMessage) {
  const std::string huge(15 << 20, '\0');
  const absl::Time start = absl::Now();
  const absl::Status s = CheckJobId(huge);
  std::printf("15 MiB id: %s in %.3f ms, message %zu bytes\n", absl::StatusCodeToString(s.code()).c_str(),
              absl::ToDoubleMilliseconds(absl::Now() - start), s.message().size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 512u);
  EXPECT_TRUE(absl::StrContains(s.message(), "(15728640 bytes)"));
  EXPECT_FALSE(CheckJobId("job-1\r\n\x1b[2J").ok());
  EXPECT_TRUE(CheckJobId("job-12-ab3f").ok());
}

TEST(DispatcherTest, CallsInFlightStayWithinTheBoundAndNoThreadIsStartedPerCall) {
  EventLog events;
  WorkerRegistry registry(absl::Seconds(10), &events);
  testing::FakeFleet fleet(64, &registry);
  testing::FakeScript slow;
  slow.step_delay = absl::Milliseconds(20);
  Dispatcher bounded(fleet.stubs(), 8);
  auto threads = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "Threads:")) return std::stoi(line.substr(8));
    }
    return -1;
  };
  std::vector<std::string> addresses;
  for (int i = 0; i < 64; ++i) addresses.push_back(fleet.worker(i).address());
  FanOut fan_out;
  fan_out.deadline = absl::Seconds(10);
  // GetInfo answers at once; every call must succeed within the bound. The
  // fakes' servers start their threads on a first fan-out; the second is
  // measured.
  bounded.Call<GetInfoRpc>(addresses, [](size_t) { return baton::v1::GetInfoRequest(); }, fan_out);
  const int before = threads();
  auto results = bounded.Call<GetInfoRpc>(addresses, [](size_t) { return baton::v1::GetInfoRequest(); }, fan_out);
  const int after = threads();
  int ok = 0;
  for (const auto& r : results) ok += r.status.ok();
  std::printf("64 calls, bound 8: %d OK, peak in flight %d; threads %d before, %d after\n", ok,
              bounded.peak_in_flight(), before, after);
  EXPECT_EQ(ok, 64);
  EXPECT_LE(bounded.peak_in_flight(), 8);
  EXPECT_LT(after - before, 16) << "threads grew with the calls";
}

}  // namespace
}  // namespace baton
