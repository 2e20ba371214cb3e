// Supervision through real daemons (issue 17's "replacement, exact"): `baton
// up`; a detached job checkpointing every 5 steps - FSDP dp=2 on 2 workers,
// FSDP x TP dp=2 x tp=2 and a 1F1B pipeline pp=2 x dp=2 on 4 - and one of
// its workers SIGKILLed at a moment drawn from a printed seed. `baton up`
// starts the worker again under its name; the job goes RECOVERING, waits
// for it, is placed again, restored from its newest checkpoint and
// finishes. Every step it ran (the replayed ones too) has the loss of an
// uninterrupted run, bit for bit. HSDP's dead worker comes back from its
// live replica instead: no disk, no step replayed. Printed: the seed, the kill's step, the
// time from the kill to the first step completed after it, and the bytes
// restored from disk and from peers. Also the budget: three kills past two
// restarts fail the job, listing the three causes.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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


// Where the restore must come from: its newest checkpoint, or the state
// its live workers kept (no disk, nothing replayed).
enum class Restore { kFromDisk, kFromLiveReplicas };

void KillAWorkerAndCheckTheJobGoesOnBitForBit(const std::string& example, int workers,
                                              Restore expected = Restore::kFromDisk) {
  testing::UpFleet fleet = testing::StartUpFleet("recovery", workers);
  ASSERT_FALSE(fleet.addr.empty()) << fleet.log();
  auto client = Client::Connect(fleet.addr);
  ASSERT_TRUE(client.ok()) << client.status();
  const int kSteps = 50;
  auto job_file = [&](const std::string& name) {
    return testing::WriteJobFile(fleet.dir, example, name, kSteps,
                                 absl::StrCat("checkpoint { dir: \"", name, "\" every_n_steps: 5 }"));
  };

  const std::string straight = fleet.Submit(job_file("straight"));
  auto straight_log = fleet.Follow(straight);
  ASSERT_EQ(straight_log.exit_code, 0) << straight_log.output;
  const std::map<int, double> uninterrupted = testing::StepLosses(straight_log.output);
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kSteps));

  // A step's time in the uninterrupted run (the controller's, median).
  std::vector<double> step_ms;
  for (const auto& line : JsonLines(straight_log.output)) step_ms.push_back(Field(line, "step_ms"));
  std::sort(step_ms.begin(), step_ms.end());
  const double median_step_ms = step_ms.empty() ? 10.0 : step_ms[step_ms.size() / 2];

  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 draw(seed);
  // The job's status moves a call at a time, and a detached job's calls end
  // at its every-5-steps saves. Up to step 20, thirty steps and six saves
  // remain: the kill lands before the job ends on a slow machine too.
  const int kill_at = std::uniform_int_distribution<int>(6, kSteps - 30)(draw);
  const int victim_rank = std::uniform_int_distribution<int>(0, workers - 1)(draw);
  // A while after that step, so the kill lands anywhere in a step or a save:
  // under 4 steps' time (at most 400 ms), so it lands before the job ends.
  const int most_delay_ms = static_cast<int>(std::min(400.0, 4 * median_step_ms));
  const absl::Duration delay = absl::Milliseconds(std::uniform_int_distribution<int>(0, most_delay_ms)(draw));
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
  auto resumed = fleet.Follow(job);
  auto final_status = (*client)->GetJob(job);
  ASSERT_TRUE(final_status.ok());
  int lines = 0, identical = 0;
  for (const auto& line : JsonLines(resumed.output)) {
    const int step = static_cast<int>(Field(line, "step"));
    ++lines;
    identical += uninterrupted.count(step) && uninterrupted.at(step) == Field(line, "loss");
  }
  std::printf("%s, seed %llu: %s SIGKILLed at step %d of %s (%.0f ms after step %d); %s after %d restart, restored "
              "from step %d (%lld bytes from disk, %lld from peers, %lld kept in place); first step after the kill "
              "%.2f s later; %d of %d "
              "step lines (replayed ones included) bit-identical to the uninterrupted run\n",
              example.c_str(), static_cast<unsigned long long>(seed), victim.c_str(), killed_at, job.c_str(),
              absl::ToDoubleMilliseconds(delay), kill_at, baton::v1::JobState_Name(final_status->state()).c_str(),
              final_status->restarts(), final_status->start_step(),
              static_cast<long long>(final_status->restored().bytes()),
              static_cast<long long>(final_status->restored().bytes_from_peers()),
              static_cast<long long>(final_status->restored().bytes_local()), back_s, identical, lines);
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
  const baton::v1::CheckpointInfo& restored = final_status->restored();
  if (expected == Restore::kFromDisk) {
    EXPECT_EQ(final_status->start_step() % 5, 0);
    EXPECT_GT(restored.bytes(), 0);
  } else {
    // At the step it failed at, every byte from the workers left.
    EXPECT_EQ(final_status->start_step(), final_status->failures(0).step());
    EXPECT_TRUE(restored.from_peers()) << restored.DebugString();
    EXPECT_EQ(restored.bytes(), 0);
    EXPECT_GT(restored.bytes_from_peers(), 0);
    EXPECT_GT(restored.bytes_local(), 0);
  }
  // Not past the failure (a step the survivors completed as the victim died
  // may be past the step the kill saw).
  EXPECT_LE(final_status->start_step(), final_status->failures(0).step());
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
    // Running (again: restarted once per kill so far) and a step past where
    // it started.
    const absl::Time until = absl::Now() + absl::Seconds(90);
    baton::v1::JobStatus s;
    while (absl::Now() < until) {
      auto j = (*client)->GetJob(job);
      if (j.ok()) s = *j;
      if (s.state() == baton::v1::JOB_RUNNING && s.restarts() == kill_no - 1 && s.step() > s.start_step()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(s.state(), baton::v1::JOB_RUNNING) << s.DebugString() << fleet.log();
    ASSERT_EQ(s.restarts(), kill_no - 1) << s.DebugString() << fleet.log();
    const std::string victim = s.workers(1);
    const pid_t pid = fleet.CurrentPid(victim);
    ASSERT_GT(pid, 0) << fleet.log();
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
  EXPECT_EQ(s.state(), baton::v1::JOB_FAILED) << fleet.log();
  EXPECT_EQ(s.restarts(), 2);
  EXPECT_EQ(s.failures_size(), 3);
  EXPECT_TRUE(absl::StrContains(s.error(), "3 failures (2 of 2 restarts used)")) << s.error();
  // Each failure's first line (its time, its step, its cause) names the
  // unreachable worker; the survivors' lines under it may quote the abort
  // that named it too, or their own view of the loss.
  int listed = 0;
  for (absl::string_view line : absl::StrSplit(s.error(), '\n')) {
    listed += absl::StrContains(line, " at step ") && absl::StrContains(line, "unreachable");
  }
  EXPECT_EQ(listed, 3) << s.error();
  EXPECT_EQ(fleet.Stop(), 0);
}

// Shrink and grow back: an FSDP dp=4 job with restart { min_workers: 2 } on
// a fleet that does not restart its workers; one killed, the job goes on
// shrunk onto dp=2 (3 free workers do not split the global batch of 16), its
// steps equal a reference resumed from the same checkpoint on dp=2; the
// worker started again by hand, the job grows back onto dp=4 at the next
// step boundary, its state moved worker to worker, and finishes.
TEST(RecoveryTest, AJobShrinksOntoTheWorkersLeftAndGrowsBack) {
  testing::UpFleet fleet = testing::StartUpFleet("shrink", 4, {"--restart_workers=false"});
  ASSERT_FALSE(fleet.addr.empty()) << fleet.log();
  auto client = Client::Connect(fleet.addr);
  ASSERT_TRUE(client.ok()) << client.status();
  const int kSteps = 300;  // long enough that a worker started by hand finds it running
  const std::string job = fleet.Submit(testing::WriteJobFile(
      fleet.dir, "decoder_fsdp4.textproto", "elastic", kSteps,
      "checkpoint { dir: \"elastic\" every_n_steps: 5 }\n"
      "restart { min_workers: 2 replacement_timeout_ms: 1000 backoff_ms: 100 }"));
  ASSERT_FALSE(job.empty());
  auto job_status = [&] {
    auto j = (*client)->GetJob(job);
    return j.ok() ? *j : baton::v1::JobStatus();
  };
  auto await = [&](const std::function<bool(const baton::v1::JobStatus&)>& cond, absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    baton::v1::JobStatus s;
    while (absl::Now() < until) {
      s = job_status();
      if (cond(s)) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return s;
  };
  baton::v1::JobStatus s = await([](const auto& s) { return s.step() >= 8; }, absl::Seconds(60));
  const std::string victim = s.workers(3);
  ASSERT_EQ(kill(fleet.CurrentPid(victim), SIGKILL), 0);
  const int killed_at = s.step();
  // Shrunk: running on 2 workers, past the step it was restored to.
  s = await([](const auto& s) { return s.state() == baton::v1::JOB_RUNNING && s.workers_size() == 2 && s.step() > s.start_step(); },
            absl::Seconds(60));
  ASSERT_EQ(s.workers_size(), 2) << s.DebugString();
  const int shrunk_from = s.start_step();
  const std::string restored = s.restored().path();
  std::printf("%s killed at step %d: %s running on [%s] (%s) from step %d (%s)\n", victim.c_str(), killed_at,
              job.c_str(), absl::StrJoin(s.workers(), ", ").c_str(),
              absl::StrJoin(s.mesh(), ",", [](std::string* out, const auto& a) { absl::StrAppend(out, a.name(), "=", a.size()); }).c_str(),
              shrunk_from, restored.c_str());
  // A few steps shrunk, then the worker is back (by hand).
  await([&](const auto& s) { return s.step() >= shrunk_from + 10; }, absl::Seconds(60));
  auto by_hand = fleet.StartWorker(victim);
  const absl::Time back = absl::Now();
  s = await([](const auto& s) { return s.state() == baton::v1::JOB_RUNNING && s.workers_size() == 4 && s.step() > s.start_step(); },
            absl::Seconds(60));
  ASSERT_EQ(s.workers_size(), 4) << s.DebugString();
  const int grew_at = s.start_step();
  std::printf("%s started again by hand: the job grew back onto 4 workers %.2f s later, at step %d (%lld bytes "
              "from peers, %lld kept in place, %lld from disk)\n",
              victim.c_str(), absl::ToDoubleSeconds(absl::Now() - back), grew_at,
              static_cast<long long>(s.restored().bytes_from_peers()), static_cast<long long>(s.restored().bytes_local()),
              static_cast<long long>(s.restored().bytes()));
  EXPECT_TRUE(s.restored().from_peers()) << s.restored().DebugString();
  EXPECT_EQ(s.restored().bytes(), 0);
  auto followed = fleet.Follow(job);
  EXPECT_EQ(followed.exit_code, 0) << followed.output;
  s = job_status();
  EXPECT_EQ(s.state(), baton::v1::JOB_FINISHED) << s.error();
  EXPECT_EQ(s.restarts(), 1);

  // The shrunk steps against a reference resumed from the same checkpoint on
  // dp=2: the steps it ran shrunk, the last time it ran them.
  std::map<int, double> shrunk;
  bool in_shrunk = false;
  for (const auto& line : absl::StrSplit(followed.output, '\n')) {
    if (absl::StartsWith(line, "{\"state\":")) {
      in_shrunk = absl::StrContains(line, "\"workers_needed\":2");
      continue;
    }
    if (in_shrunk && absl::StartsWith(line, "{\"step\":")) {
      shrunk[static_cast<int>(Field(std::string(line), "step"))] = Field(std::string(line), "loss");
    }
  }
  std::string reference_file = testing::WriteJobFile(fleet.dir, "decoder_fsdp4.textproto", "reference", grew_at,
                                                     absl::StrCat("resume_from: \"", restored, "\""));
  {
    // The reference's mesh: dp=2.
    std::string text = testing::ReadFile(reference_file);
    text.replace(text.find("size: 4"), 7, "size: 2");
    FILE* f = std::fopen(reference_file.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  const std::string reference = fleet.Submit(reference_file);
  auto reference_log = fleet.Follow(reference);
  ASSERT_EQ(reference_log.exit_code, 0) << reference_log.output;
  const std::map<int, double> expected = testing::StepLosses(reference_log.output);
  double worst = 0;
  int compared = 0;
  for (const auto& [step, loss] : shrunk) {
    if (step > grew_at || !expected.count(step)) continue;
    worst = std::max(worst, std::abs(loss - expected.at(step)) / std::abs(expected.at(step)));
    ++compared;
  }
  std::printf("steps %d-%d shrunk onto dp=2: %d compared with a reference resumed from %s on dp=2, worst relative "
              "difference %.3g; %s %s at step %d\n",
              shrunk_from + 1, grew_at, compared, restored.c_str(), worst, job.c_str(),
              baton::v1::JobState_Name(s.state()).c_str(), s.step());
  EXPECT_GE(compared, 10);
  EXPECT_LE(worst, 1e-5);
  EXPECT_EQ(fleet.Stop(), 0);
  kill(by_hand.pid, SIGTERM);
  testing::WaitBackground(by_hand, absl::Seconds(20));
}

TEST(RecoveryTest, FsdpOnTwoWorkers) { KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_fsdp2.textproto", 2); }
TEST(RecoveryTest, FsdpTimesTensorParallelOnFour) {
  KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_fsdp_tp.textproto", 4);
}
TEST(RecoveryTest, OneFOneBPipelineTimesFsdpOnFour) {
  KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_pp2_fsdp2.textproto", 4);
}
// HSDP replicate 2 x shard 2: the dead worker's shards live on in its
// replica; restored worker to worker, 0 bytes from disk although a
// checkpoint exists.
TEST(RecoveryTest, HsdpFromLiveReplicasWithoutDisk) {
  KillAWorkerAndCheckTheJobGoesOnBitForBit("decoder_hsdp.textproto", 4, Restore::kFromLiveReplicas);
}

}  // namespace
}  // namespace baton
