// A streamed Step (an attached client's StepStream) against in-process fake
// workers: each call reported as it settles, fast steps sent together at
// most once per part interval, and what has not started withdrawn when the
// caller leaves.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/controller_service.h"
#include "controller/testing/harness.h"

namespace baton {
namespace {

using testing::CheckpointingHarnessOptions;
using testing::ControllerHarness;
using testing::MlpJob;
using testing::SlowSteps;
using testing::WaitFor;

TEST(JobManagerTest, AStreamedStepReportsEachCallAsItSettles) {
  ControllerHarness h(CheckpointingHarnessOptions());
  // A call per part interval: each can settle in a part of its own.
  SlowSteps(h, JobManager::kStepPartInterval);
  auto job = h.jobs().Create(MlpJob("streamed", 100, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                     "checkpoint { dir: \"ckpt\" every_n_steps: 4 }"),
                             absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::vector<int>> parts;
  std::vector<int> part_status;
  std::vector<size_t> part_errors;
  std::string errors;
  auto take = [&](JobManager::StepOutcome&& part) {
    parts.emplace_back();
    for (const auto& m : part.metrics) parts.back().push_back(m.step());
    part_status.push_back(part.status.step());
    part_errors.push_back(part.checkpoint_errors.size());
    // The fakes write nothing: each periodic save is tried and fails.
    for (const auto& e : part.checkpoint_errors) {
      for (int step : {4, 8}) {
        if (absl::StrContains(e, absl::StrCat("saving step ", step, " "))) absl::StrAppend(&errors, "[", step, "]");
      }
    }
    return true;
  };
  auto last = h.jobs().Step((*job)->id(), 10, 3, 30000, absl::Now() + absl::Seconds(10), nullptr, take);
  ASSERT_TRUE(last.ok()) << last.status();
  take(std::move(*last));
  std::string shown;
  std::vector<int> all;
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::StrAppend(&shown, " [", absl::StrJoin(parts[i], ","), "]@", part_status[i]);
    all.insert(all.end(), parts[i].begin(), parts[i].end());
  }
  std::printf("Step(10) streamed, steps_per_call 3, checkpoint every 4: parts%s; failed saves %s; %d RunStep calls\n",
              shown.c_str(), errors.c_str(), h.worker(0).step_calls());
  EXPECT_EQ(all, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(errors, "[4][8]");
  // Reported as it went: a part per call (1-3, 4, 5-7, 8, 9-10) unless the
  // caller woke late (two calls in one part), each with the job's status
  // once its steps were in. A save that fails after its step's part went
  // out comes in a part of its own, with no steps.
  EXPECT_GE(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_TRUE(!parts[i].empty() || part_errors[i] > 0) << "part " << i << " carries nothing";
    if (!parts[i].empty()) EXPECT_GE(part_status[i], parts[i].back());
  }
  EXPECT_EQ(h.worker(0).step_calls(), 5);
}

TEST(JobManagerTest, AStreamedStepSendsFastStepsTogetherAtMostOncePerPartInterval) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(1));  // a fake's step takes 5 ms at least
  auto job = h.jobs().Create(MlpJob("fast", 200), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<int> all;
  int parts = 0;
  auto take = [&](JobManager::StepOutcome&& part) {
    ++parts;
    EXPECT_FALSE(part.metrics.empty());
    for (const auto& m : part.metrics) all.push_back(m.step());
    return true;
  };
  const absl::Time start = absl::Now();
  auto last = h.jobs().Step((*job)->id(), 100, 1, 30000, absl::Now() + absl::Seconds(30), nullptr, take);
  const double elapsed_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  ASSERT_TRUE(last.ok()) << last.status();
  for (const auto& m : last->metrics) all.push_back(m.step());
  std::vector<int> expected(100);
  for (int i = 0; i < 100; ++i) expected[i] = i + 1;
  // One part per interval at most (and the last answer); without the
  // interval it was a part per step.
  const double interval_ms = absl::ToDoubleMilliseconds(JobManager::kStepPartInterval);
  const int most = static_cast<int>(elapsed_ms / interval_ms) + 2;
  std::printf("Step(100) streamed, steps of >= 5 ms: %d parts before the answer in %.0f ms (at most %d, one per %.0f "
              "ms); %zu steps\n", parts, elapsed_ms, most, interval_ms, all.size());
  EXPECT_EQ(all, expected);
  EXPECT_LE(parts, most);
  EXPECT_GE(parts, 2);
}

TEST(JobManagerTest, AStreamedStepWhoseCallerLeavesWithdrawsWhatHasNotStarted) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(100));
  auto job = h.jobs().Create(MlpJob("left", 100), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();
  int parts = 0;
  auto stepped = h.jobs().Step((*job)->id(), 50, 1, 30000, absl::Now() + absl::Seconds(10), nullptr,
                               [&](JobManager::StepOutcome&&) { return ++parts < 2; });
  const int at = (*job)->step();
  absl::SleepFor(absl::Milliseconds(500));
  std::printf("the caller left after %d parts: %s; job at step %d, %d half a second later\n", parts,
              stepped.status().ToString().c_str(), at, (*job)->step());
  EXPECT_EQ(stepped.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(parts, 2);
  // At most the calls on the wire when it left complete: the step running
  // and the one sent ahead of it.
  EXPECT_LE((*job)->step(), at + 2);
}

}  // namespace
}  // namespace baton
