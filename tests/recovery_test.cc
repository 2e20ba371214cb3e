// Supervision through real daemons (issue 17's "replacement, exact"): `baton
// up` with 2 workers; a detached FSDP dp=2 job checkpointing every 5 steps;
// a worker SIGKILLed at a step drawn from a printed seed. `baton up` starts
// the worker again under its name; the job goes RECOVERING, waits for it,
// is placed again, restored from its newest checkpoint and finishes. Every
// step it ran (the replayed ones too) has the loss of an uninterrupted run,
// bit for bit. Printed: the seed, the kill's step, the time from the kill to
// the first step completed after it, and the bytes restored from disk and
// from peers.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::Field;
using testing::JsonLines;
using testing::ReadFile;
using testing::RunCommand;
using testing::Runfile;

std::string WriteJob(const std::string& dir, const std::string& name, int steps) {
  std::string text = ReadFile(Runfile("examples/decoder_fsdp2.textproto"));
  text.replace(text.find("name: \"decoder_fsdp2\""), 21, absl::StrCat("name: \"", name, "\""));
  text.replace(text.find("steps: 20"), 9, absl::StrCat("steps: ", steps));
  absl::StrAppend(&text, "\ncheckpoint { dir: \"", name, "\" every_n_steps: 5 }\n");
  const std::string path = absl::StrCat(dir, "/", name, ".textproto");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

pid_t PidIn(const std::string& up_log, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(up_log, '\n')) {
    if (absl::StartsWith(line, name + ": pid ")) {
      int pid = 0;
      if (absl::SimpleAtoi(line.substr(name.size() + 6), &pid)) return pid;
    }
  }
  return 0;
}

TEST(RecoveryTest, AKilledWorkerIsReplacedAndTheJobGoesOnBitForBit) {
  const std::string dir = testing::TempDir("recovery");
  const std::string root = dir + "/root";
  ASSERT_EQ(system(absl::StrCat("mkdir -p ", root).c_str()), 0);
  setenv("BATON_TOKEN_FILE", (dir + "/client.token").c_str(), 1);
  auto up = testing::StartBackground(
      {testing::BatonBinary(), "up", "--workers=2", "--address_file=" + dir + "/addr", "--checkpoint_root=" + root,
       "--http_port=-1", "--controller_bin=" + Runfile("controller/baton-controller"),
       "--worker_bin=" + Runfile("worker/baton-worker")},
      dir + "/up.log");
  const std::string addr = testing::AwaitLine(dir + "/addr", absl::Seconds(60));
  ASSERT_FALSE(addr.empty()) << ReadFile(dir + "/up.log");
  auto cli = [&](std::vector<std::string> args, absl::Duration timeout = absl::Seconds(60)) {
    args.insert(args.begin(), testing::BatonBinary());
    args.push_back("--controller=" + addr);
    return RunCommand(args, timeout);
  };
  auto id_of = [](const testing::CommandResult& r) {
    std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
    return lines.empty() ? std::string() : lines.back();
  };
  auto client = Client::Connect(addr);
  ASSERT_TRUE(client.ok()) << client.status();

  const int kSteps = 30;
  const std::string straight = id_of(cli({"submit", WriteJob(dir, "straight", kSteps)}));
  auto straight_log = cli({"logs", straight, "--follow", "--output=json"}, absl::Seconds(240));
  ASSERT_EQ(straight_log.exit_code, 0) << straight_log.output;
  std::map<int, double> uninterrupted;
  for (const auto& line : JsonLines(straight_log.output)) uninterrupted[static_cast<int>(Field(line, "step"))] = Field(line, "loss");
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kSteps));

  const char* seed_env = std::getenv("BATON_TEST_SEED");
  const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : absl::ToUnixNanos(absl::Now());
  const int kill_at = std::uniform_int_distribution<int>(6, kSteps - 6)(*std::make_unique<std::mt19937_64>(seed));
  const std::string job = id_of(cli({"submit", WriteJob(dir, "interrupted", kSteps)}));
  auto step_of = [&] {
    auto j = (*client)->GetJob(job);
    return j.ok() ? j->step() : -1;
  };
  const absl::Time wait_until = absl::Now() + absl::Seconds(120);
  while (step_of() < kill_at && absl::Now() < wait_until) absl::SleepFor(absl::Milliseconds(5));
  auto status = (*client)->GetJob(job);
  ASSERT_TRUE(status.ok());
  ASSERT_LT(status->step(), kSteps) << "the job ended before the kill";
  const std::string victim = status->workers(1);
  const pid_t pid = PidIn(ReadFile(dir + "/up.log"), victim);
  ASSERT_GT(pid, 0) << ReadFile(dir + "/up.log");
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
  auto resumed = cli({"logs", job, "--follow", "--output=json"}, absl::Seconds(240));
  auto final_status = (*client)->GetJob(job);
  ASSERT_TRUE(final_status.ok());
  int lines = 0, identical = 0;
  for (const auto& line : JsonLines(resumed.output)) {
    const int step = static_cast<int>(Field(line, "step"));
    ++lines;
    identical += uninterrupted.count(step) && uninterrupted.at(step) == Field(line, "loss");
  }
  std::printf("seed %llu: %s SIGKILLed at step %d of %s; %s after %d restart, restored from step %d "
              "(%lld bytes from disk, 0 from peers); first step after the kill %.2f s later; %d of %d step lines "
              "(replayed ones included) bit-identical to the uninterrupted run\n",
              static_cast<unsigned long long>(seed), victim.c_str(), killed_at, job.c_str(),
              baton::v1::JobState_Name(final_status->state()).c_str(), final_status->restarts(),
              final_status->start_step(), static_cast<long long>(final_status->restored().bytes()), back_s, identical,
              lines);
  for (absl::string_view line : absl::StrSplit(ReadFile(dir + "/up.log"), '\n')) {
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
  EXPECT_GT(lines, kSteps);  // the steps after the checkpoint ran twice
  EXPECT_EQ(identical, lines);
  EXPECT_TRUE(absl::StrContains(ReadFile(dir + "/up.log"), victim + " restarted"));
  kill(up.pid, SIGTERM);
  EXPECT_EQ(testing::WaitBackground(up, absl::Seconds(20)), 0);
  // Every worker process, the restarted one too, is gone.
  for (absl::string_view line : absl::StrSplit(ReadFile(dir + "/up.log"), '\n')) {
    int restarted = 0;
    const size_t at = line.find("restarted (pid ");
    if (at != absl::string_view::npos && absl::SimpleAtoi(line.substr(at + 15, line.size() - at - 16), &restarted)) {
      EXPECT_TRUE(testing::ProcessGone(restarted)) << line << " left behind";
    }
  }
  EXPECT_TRUE(testing::ProcessGone(PidIn(ReadFile(dir + "/up.log"), victim == "worker-0" ? "worker-1" : "worker-0")));
}

}  // namespace
}  // namespace baton
