// Supervision through real daemons (issue 17's "replacement, exact"): `baton
// up`; a detached job checkpointing every 5 steps - FSDP dp=2 on 2 workers,
// FSDP x TP dp=2 x tp=2 and a 1F1B pipeline pp=2 x dp=2 on 4 - and one of
// its workers SIGKILLed at a moment drawn from a printed seed. `baton up`
// starts the worker again under its name; the job goes RECOVERING, waits
// for it, is placed again, restored from its newest checkpoint and
// finishes. Every step it ran (the replayed ones too) has the loss of an
// uninterrupted run, bit for bit. Printed: the seed, the kill's step, the
// time from the kill to the first step completed after it, and the bytes
// restored from disk and from peers. Also the budget: three kills past two
// restarts fail the job, listing the three causes.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/cluster_util.h"
#include "tests/step_lines.h"
#include "tests/up_fleet.h"

namespace baton {
namespace {

using testing::JsonLines;
using testing::Field;

uint64_t Seed() {
  const char* seed = std::getenv("BATON_TEST_SEED");
  return seed != nullptr ? std::strtoull(seed, nullptr, 10) : absl::ToUnixNanos(absl::Now());
}

void KillAWorkerAndCheckTheJobGoesOnBitForBit(const std::string& example, int workers) {
  testing::UpFleet fleet = testing::StartUpFleet("recovery", workers);
  ASSERT_FALSE(fleet.addr.empty()) << fleet.log();
  auto client = Client::Connect(fleet.addr);
  ASSERT_TRUE(client.ok()) << client.status();
  const int kSteps = 30;
  auto job_file = [&](const std::string& name) {
    return testing::WriteJobFile(fleet.dir, example, name, kSteps,
                                 absl::StrCat("checkpoint { dir: \"", name, "\" every_n_steps: 5 }"));
  };

  const std::string straight = fleet.Submit(job_file("straight"));
  auto straight_log = fleet.Cli({"logs", straight, "--follow", "--output=json"}, absl::Seconds(240));
  ASSERT_EQ(straight_log.exit_code, 0) << straight_log.output;
  const std::map<int, double> uninterrupted = testing::StepLosses(straight_log.output);
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kSteps));

  const uint64_t seed = Seed();
  std::mt19937_64 draw(seed);
  const int kill_at = std::uniform_int_distribution<int>(6, kSteps - 6)(draw);
  const int victim_rank = std::uniform_int_distribution<int>(0, workers - 1)(draw);
  // A while after that step, so the kill lands anywhere in a step or a save.
  const absl::Duration delay = absl::Milliseconds(std::uniform_int_distribution<int>(0, 400)(draw));
  const std::string job = fleet.Submit(job_file("interrupted"));
  auto step_of = [&] {
    auto j = (*client)->GetJob(job);
    return j.ok() ? j->step() : -1;
  };
  const absl::Time wait_until = absl::Now() + absl::Seconds(120);
  while (step_of() < kill_at && absl::Now() < wait_until) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(delay);
  auto status = (*client)->GetJob(job);
  ASSERT_TRUE(status.ok());
  ASSERT_LT(status->step(), kSteps) << "the job ended before the kill";
  const std::string victim = status->workers(victim_rank);
  const pid_t pid = fleet.CurrentPid(victim);
  ASSERT_GT(pid, 0) << fleet.log();
  const int killed_at = status->step();
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);

  // The first step completed after the kill: RUNNING again, past the step
  // it was restored to.
  double back_s = -1;
  while (absl::Now() - killed < absl::Seconds(120)) {
    auto j = (*client)->GetJob(job);
    if (j.ok() && j->restarts() == 1 && j->state() == baton::v1::JOB_RUNNING && j->step() > j->start_step()) {
      back_s = absl::ToDoubleSeconds(absl::Now() - killed);
      break;
    }
    if (j.ok() && (j->state() == baton::v1::JOB_FAILED || j->state() == baton::v1::JOB_FINISHED)) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  auto resumed = fleet.Cli({"logs", job, "--follow", "--output=json"}, absl::Seconds(240));
  auto final_status = (*client)->GetJob(job);
  ASSERT_TRUE(final_status.ok());
  int lines = 0, identical = 0;
  for (const auto& line : JsonLines(resumed.output)) {
    const int step = static_cast<int>(Field(line, "step"));
    ++lines;
    identical += uninterrupted.count(step) && uninterrupted.at(step) == Field(line, "loss");
  }
  std::printf("%s, seed %llu: %s SIGKILLed at step %d of %s (%.0f ms after step %d); %s after %d restart, restored "
              "from step %d (%lld bytes from disk, 0 from peers); first step after the kill %.2f s later; %d of %d "
              "step lines (replayed ones included) bit-identical to the uninterrupted run\n",
              example.c_str(), static_cast<unsigned long long>(seed), victim.c_str(), killed_at, job.c_str(),
              absl::ToDoubleMilliseconds(delay), kill_at, baton::v1::JobState_Name(final_status->state()).c_str(),
              final_status->restarts(), final_status->start_step(),
              static_cast<long long>(final_status->restored().bytes()), back_s, identical, lines);
  for (absl::string_view line : absl::StrSplit(fleet.log(), '\n')) {
    if (absl::StrContains(line, "restarted") || absl::StrContains(line, "RECOVERING")) {
      std::printf("  up: %s\n", std::string(line).c_str());
    }
  }
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(final_status->state(), baton::v1::JOB_FINISHED) << final_status->error();
  EXPECT_EQ(final_status->restarts(), 1);
  ASSERT_EQ(final_status->failures_size(), 1);
  EXPECT_TRUE(absl::StrContains(final_status->failures(0).cause(), victim)) << final_status->failures(0).cause();
  EXPECT_EQ(final_status->start_step() % 5, 0);
  EXPECT_LE(final_status->start_step(), killed_at);
  EXPECT_GT(back_s, 0);
  // The steps between its checkpoint and the failure ran twice; the rest once.
  EXPECT_EQ(lines, kSteps + final_status->failures(0).step() - final_status->start_step());
  EXPECT_EQ(identical, lines);
  EXPECT_TRUE(absl::StrContains(fleet.log(), victim + " restarted"));
  EXPECT_EQ(fleet.Stop(), 0);
  for (const pid_t p : fleet.AllPids()) EXPECT_TRUE(testing::ProcessGone(p)) << "pid " << p << " left behind";
}

// The restart budget: max_restarts 2 and a worker killed three times - the
// job fails after the third, listing the three causes with their times.
TEST(RecoveryTest, ThreeKillsPastTwoRestartsFailTheJobListingEveryCause) {
  testing::UpFleet fleet = testing::StartUpFleet("budget", 2);
  ASSERT_FALSE(fleet.addr.empty()) << fleet.log();
  auto client = Client::Connect(fleet.addr);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string job = fleet.Submit(testing::WriteJobFile(fleet.dir, "decoder_fsdp2.textproto", "budget", 100000,
                                                             "restart { max_restarts: 2 backoff_ms: 100 }"));
  ASSERT_FALSE(job.empty());
  for (int kill_no = 1; kill_no <= 3; ++kill_no) {
    // Running (again) and a step past where it started.
    const absl::Time until = absl::Now() + absl::Seconds(90);
    baton::v1::JobStatus s;
    while (absl::Now() < until) {
      auto j = (*client)->GetJob(job);
      if (j.ok()) s = *j;
      if (s.state() == baton::v1::JOB_RUNNING && s.step() > s.start_step()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(s.state(), baton::v1::JOB_RUNNING) << s.DebugString();
    const std::string victim = s.workers(1);
    const pid_t pid = fleet.CurrentPid(victim);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    std::printf("kill %d: %s (pid %d) at step %d\n", kill_no, victim.c_str(), pid, s.step());
    const absl::Time noticed = absl::Now() + absl::Seconds(60);
    while (absl::Now() < noticed) {
      auto j = (*client)->GetJob(job);
      if (j.ok() && (j->failures_size() >= kill_no || j->state() == baton::v1::JOB_FAILED)) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  baton::v1::JobStatus s;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until) {
    auto j = (*client)->GetJob(job);
    if (j.ok()) s = *j;
    if (s.state() == baton::v1::JOB_FAILED) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("%s %s:\n%s\n", job.c_str(), baton::v1::JobState_Name(s.state()).c_str(), s.error().c_str());
  EXPECT_EQ(s.state(), baton::v1::JOB_FAILED);
  EXPECT_EQ(s.restarts(), 2);
  EXPECT_EQ(s.failures_size(), 3);
  EXPECT_TRUE(absl::StrContains(s.error(), "3 failures (2 of 2 restarts used)")) << s.error();
  int listed = 0;
  for (absl::string_view line : absl::StrSplit(s.error(), '\n')) listed += absl::StrContains(line, "unreachable");
  EXPECT_EQ(listed, 3) << s.error();
  EXPECT_EQ(fleet.Stop(), 0);
}

TEST(RecoveryTest, FsdpOnTwoWorkers) { KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_fsdp2.textproto", 2); }
TEST(RecoveryTest, FsdpTimesTensorParallelOnFour) {
  KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_fsdp_tp.textproto", 4);
}
TEST(RecoveryTest, OneFOneBPipelineTimesFsdpOnFour) {
  KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_pp2_fsdp2.textproto", 4);
}

}  // namespace
}  // namespace baton
