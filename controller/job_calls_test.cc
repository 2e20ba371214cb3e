// An attached job's client against in-process fake workers: leases that
// lapse or are kept, Step's deadline and the step it leaves running counted
// once, metrics answered once, an idle job whose worker dies; K steps per
// call, asked by a client or taken by a detached job, never past a
// checkpoint's step. (A streamed Step: job_stream_test.)
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

using testing::CheckpointingHarnessOptions;
using testing::ControllerHarness;
using testing::HarnessOptions;
using testing::MlpJob;
using testing::SlowSteps;
using testing::TempDir;
using testing::WaitFor;

TEST(JobManagerTest, ALapsedLeaseStopsTheJobAndFreesItsWorkers) {
  HarnessOptions options;
  options.jobs.default_lease = absl::Seconds(1);
  ControllerHarness h(options);
  auto job = h.jobs().Create(MlpJob("leased", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  auto stepped = h.jobs().Step((*job)->id(), 2, 1, 30000, absl::Now() + absl::Seconds(5), nullptr);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  const absl::Time last_call = absl::Now();
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 2u);
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  const double after = absl::ToDoubleSeconds(absl::Now() - last_call);
  std::printf("lease 1 s: %s %.2f s after the last call (%s); free workers %zu\n",
              baton::v1::JobState_Name((*job)->state()).c_str(), after, (*job)->status().error().c_str(),
              h.meshes().FreeWorkers().size());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_STOPPED);
  EXPECT_TRUE(absl::StrContains((*job)->status().error(), "lease lapsed"));
  EXPECT_LT(after, 2.5);
  EXPECT_EQ(h.meshes().FreeWorkers().size(), 4u);
  EXPECT_EQ((*job)->step(), 2);
}

TEST(JobManagerTest, CallsKeepTheLease) {
  HarnessOptions options;
  options.jobs.default_lease = absl::Seconds(1);
  ControllerHarness h(options);
  auto job = h.jobs().Create(MlpJob("kept", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok());
  for (int i = 0; i < 25; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(h.jobs().KeepAlive((*job)->id()).ok());
  }
  std::printf("after 2.5 s of KeepAlive every 100 ms (lease 1 s): %s\n",
              baton::v1::JobState_Name((*job)->state()).c_str());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_RUNNING);
}

// An attached job on fake-0 and fake-1 (dp=2) whose rank 0 follows `rank0`.
std::shared_ptr<Job> JobWithRank0(ControllerHarness& h, const std::string& name, const testing::FakeScript& rank0) {
  h.worker(0).set_script(rank0);
  auto job = h.jobs().Create(MlpJob(name, 100, "workers: [\"fake-0\", \"fake-1\"] mesh { name: \"dp\" size: 2 }"),
                             absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}
// The steps `job`'s log holds.
int StepEntries(Job& job) {
  int logged = 0;
  for (const auto& e : job.log().After(0)) logged += e.has_step();
  return logged;
}

TEST(JobManagerTest, StepHonoursItsDeadlineAndTheRunningStepIsCountedOnce) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(1500));
  auto job = h.jobs().Create(MlpJob("slow", 10), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok());
  const absl::Time start = absl::Now();
  auto stepped = h.jobs().Step((*job)->id(), 3, 1, 30000, start + absl::Milliseconds(300), nullptr);
  const double returned = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("Step(3) with a 0.3 s deadline, steps of 1.5 s: returned after %.2f s: %s\n", returned,
              stepped.status().ToString().c_str());
  EXPECT_EQ(stepped.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(returned, 1.0);
  // The step that was running completes and is counted; the two not
  // started are withdrawn (the first call on a mesh runs alone: no call is
  // sent ahead of it).
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
  auto first = h.jobs().Step((*job)->id(), 3, 1, 30000, absl::Now() + absl::Seconds(10), nullptr);
  auto second = h.jobs().Step((*job)->id(), 2, 1, 30000, absl::Now() + absl::Seconds(10), nullptr);
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
  auto step = h.jobs().Step((*job)->id(), 1, 1, 30000, absl::Now() + absl::Seconds(2), nullptr);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition) << step.status();
}

TEST(JobManagerTest, AClientsKStepsRunInOneRoundTripEach) {
  ControllerHarness h{HarnessOptions()};
  auto job = h.jobs().Create(MlpJob("k-steps", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  auto stepped = h.jobs().Step((*job)->id(), 10, 4, 30000, absl::Now() + absl::Seconds(10), nullptr);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  std::string steps;
  for (const auto& m : stepped->metrics) absl::StrAppend(&steps, steps.empty() ? "" : ",", m.step());
  std::printf("Step(10) with steps_per_call 4: steps %s in %d RunStep calls on rank 0 (%d steps run)\n", steps.c_str(),
              h.worker(0).step_calls(), h.worker(0).steps_run());
  EXPECT_EQ(steps, "1,2,3,4,5,6,7,8,9,10");
  EXPECT_EQ(h.worker(0).step_calls(), 3);  // 4 + 4 + 2
  EXPECT_EQ(h.worker(0).steps_run(), 10);
  EXPECT_EQ((*job)->step(), 10);
}

// K = 0 (`baton run`'s default): the runner paces an attached job as it
// does a detached one - one step to learn the pace, then a second's worth.
TEST(JobManagerTest, AClientThatLeavesKToTheControllerGetsOneStepThenASecondsWorthPerCall) {
  ControllerHarness h{HarnessOptions()};
  SlowSteps(h, absl::Milliseconds(5));
  auto job = h.jobs().Create(MlpJob("k-paced", 300), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  auto stepped = h.jobs().Step((*job)->id(), 300, 0, 30000, absl::Now() + absl::Seconds(30), nullptr);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  int in_order = 0;
  for (const auto& m : stepped->metrics) in_order += m.step() == in_order + 1;
  const int calls = h.worker(0).step_calls();
  std::printf("Step(300) of 5 ms steps, K left to the controller: %d steps answered in order, %d RunStep calls on "
              "rank 0 (%d steps run)\n", in_order, calls, h.worker(0).steps_run());
  EXPECT_EQ(in_order, 300);
  EXPECT_EQ(h.worker(0).steps_run(), 300);
  // [1], then a second's worth (at most 200 steps of >= 5 ms) per call:
  // three calls, a few more on a loaded machine - not 300.
  EXPECT_GE(calls, 3);
  EXPECT_LE(calls, 6);
}

// The next call goes on the wire while one runs (the worker takes it up
// the moment the one before ends): every call after the first arrives
// while the one before it still runs, the steps stay in order, and the
// calls' times per step do not overlap (they add up to no more than the
// wall time).
TEST(JobManagerTest, TheNextCallIsOnTheWireWhileOneRuns) {
  ControllerHarness h{HarnessOptions()};
  // Calls of 200 ms: the next one is sent well before the one running ends.
  constexpr int kStepMs = 100;
  SlowSteps(h, absl::Milliseconds(kStepMs));
  auto job = h.jobs().Create(MlpJob("ahead", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Time start = absl::Now();
  auto stepped = h.jobs().Step((*job)->id(), 12, 2, 30000, absl::Now() + absl::Seconds(20), nullptr);
  const double wall_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  int in_order = 0;
  double step_ms = 0;
  for (const auto& m : stepped->metrics) {
    in_order += m.step() == in_order + 1;
    step_ms += m.step_ms();
  }
  std::printf("Step(12) of %d ms steps, 2 per call: %d in order, %d calls on rank 0, %d of them sent while the one "
              "before ran; steps' times add up to %.0f ms of %.0f ms wall\n", kStepMs, in_order,
              h.worker(0).step_calls(), h.worker(0).calls_ahead(), step_ms, wall_ms);
  EXPECT_EQ(in_order, 12);
  EXPECT_EQ(h.worker(0).step_calls(), 6);
  // All but the first two: nothing is sent ahead of a mesh's first call.
  EXPECT_EQ(h.worker(0).calls_ahead(), 4);
  EXPECT_LE(step_ms, wall_ms);
  // And none is lost: the fakes sleep kStepMs a step (a response's latency
  // may take a little off a call's measured share).
  EXPECT_GE(step_ms, 0.9 * 12 * kStepMs);
}

// A call fails while the next one is on the wire: that one is cancelled,
// none of its steps is counted, and the job fails at the failed step.
TEST(JobManagerTest, AFailedCallTakesTheCallSentAheadOfItWithIt) {
  ControllerHarness h{HarnessOptions()};
  SlowSteps(h, absl::Milliseconds(20));
  testing::FakeScript fail;
  fail.step_delay = absl::Milliseconds(20);
  fail.fail_at_step = 6;
  const std::shared_ptr<Job> job = JobWithRank0(h, "ahead-fails", fail);
  ASSERT_NE(job, nullptr);
  auto stepped = h.jobs().Step(job->id(), 20, 3, 30000, absl::Now() + absl::Seconds(10), nullptr);
  const int logged = StepEntries(*job);
  std::printf("rank 0 fails at step 6 of calls of 3, one sent ahead: job at step %d, %d step entries, rank 0 ran %d "
              "steps, rank 1 %d; %s\n", job->step(), logged, h.worker(0).steps_run(), h.worker(1).steps_run(),
              stepped.status().ToString().substr(0, 120).c_str());
  EXPECT_FALSE(stepped.ok());
  EXPECT_TRUE(absl::StrContains(stepped.status().message(), "step 6 failed")) << stepped.status();
  EXPECT_EQ(job->step(), 5);
  EXPECT_EQ(logged, 5);
  EXPECT_EQ(h.worker(0).steps_run(), 5);
}

// A client's save while a detached job runs its calls back to back: the
// runner sends nothing ahead of it and lets it in after the call on the
// wire (the fakes write nothing: the save is tried, between two calls, and
// fails), then goes on to the end.
TEST(JobManagerTest, AClientsSaveGetsInBetweenCallsSentAhead) {
  ControllerHarness h(CheckpointingHarnessOptions());
  SlowSteps(h, absl::Milliseconds(10));
  auto job = h.jobs().Submit(MlpJob("save-between", 300));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() >= 20; }));
  const int before = (*job)->step();
  const absl::Time start = absl::Now();
  auto saved = h.jobs().Save((*job)->id(), "asked", /*async=*/false);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const int after = (*job)->step();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }, absl::Seconds(30)));
  std::printf("a save asked at step %d ran by step %d, answered after %.2f s: %s; the job %s at step %d\n", before,
              after, seconds, saved.status().ToString().substr(0, 100).c_str(),
              baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->step());
  EXPECT_FALSE(saved.ok());  // tried: the fakes write nothing
  EXPECT_TRUE(absl::StrContains(saved.status().message(), "saves nothing")) << saved.status();
  // The call running and the one ahead of it (a second's worth each) at most.
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ((*job)->step(), 300);
}

TEST(JobManagerTest, ARankFailingAtACallsFirstStepCountsNoneOfItsSteps) {
  // Rank 0 fails at step 5, the first of the second call of 4, while rank 1
  // (a fake needs no peer) completes all 4: the steps completed everywhere
  // are 1-4. Rank 0's answer said so only through its failed_step: with
  // rank 0 and no metrics its details were empty, read as "says nothing",
  // and rank 1's steps 5-8 were counted.
  ControllerHarness h{HarnessOptions()};
  testing::FakeScript fail;
  fail.fail_at_step = 5;
  const std::shared_ptr<Job> job = JobWithRank0(h, "first-of-call", fail);
  ASSERT_NE(job, nullptr);
  auto stepped = h.jobs().Step(job->id(), 10, 4, 30000, absl::Now() + absl::Seconds(10), nullptr);
  const int logged = StepEntries(*job);
  std::printf("rank 0 fails at step 5 of calls of 4: job at step %d, %d step entries; %s\n", job->step(), logged,
              stepped.status().ToString().substr(0, 160).c_str());
  EXPECT_FALSE(stepped.ok());
  EXPECT_EQ(job->step(), 4);
  EXPECT_EQ(logged, 4);
  EXPECT_TRUE(absl::StrContains(stepped.status().message(), "step 5 failed")) << stepped.status();
}

TEST(JobManagerTest, ADetachedJobTakesASecondsWorthOfStepsPerCallButStopsAtEachCheckpoint) {
  ControllerHarness h(CheckpointingHarnessOptions());
  SlowSteps(h, absl::Milliseconds(2));
  auto job = h.jobs().Submit(MlpJob("k-detached", 40, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                      "checkpoint { dir: \"ckpt\" every_n_steps: 15 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  std::string steps, saved;
  int logged = 0;
  for (const auto& e : (*job)->log().After(0)) {
    if (e.has_step()) logged += e.step().step() == logged + 1;
    // The fakes write nothing: each periodic save is tried at its step and fails.
    if (e.entry_case() == baton::v1::JobLogEntry::kCheckpointError) {
      for (int step : {15, 30, 45}) {
        if (absl::StrContains(e.checkpoint_error(), absl::StrCat("saving step ", step, " "))) {
          absl::StrAppend(&saved, saved.empty() ? "" : ",", step);
        }
      }
    }
  }
  const int calls = std::max(h.worker(0).step_calls(), h.worker(2).step_calls());
  std::printf("detached, 40 steps of 2 ms, checkpoint every 15: %s at step %d, %d steps logged in order, %d RunStep "
              "calls, saves tried at steps %s\n", baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->step(),
              logged, calls, saved.c_str());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ(logged, 40);
  EXPECT_EQ(saved, "15,30");
  // One step to learn the pace (nothing is sent ahead of it), then up to
  // each checkpoint and the end: [1], [2, 15], [16, 30], [31, 40].
  EXPECT_EQ(calls, 4);
}

}  // namespace
}  // namespace baton
