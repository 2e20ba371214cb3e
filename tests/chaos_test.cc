// Chaos (issue 17): during a 200-step detached FSDP dp=2 job checkpointing
// every 10 steps (restart { max_restarts: 25 }), 20 faults drawn from a
// printed seed - SIGKILL a worker, SIGSTOP a worker for 10 s, SIGKILL the
// controller - each while the job runs. `baton up` restarts what died. The
// job finishes; every worker fault is one of its recorded failures, naming
// the worker, and every controller kill one of its resumes; every step it ran
// (the replayed ones too) has the loss of an uninterrupted run, bit for bit;
// no process is left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>
#include <random>
#include <set>

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

std::string WriteJob(const std::string& dir, const std::string& name, const std::string& extra) {
  std::string text = ReadFile(Runfile("examples/decoder_fsdp2.textproto"));
  text.replace(text.find("name: \"decoder_fsdp2\""), 21, absl::StrCat("name: \"", name, "\""));
  text.replace(text.find("steps: 20"), 9, "steps: 200");
  absl::StrAppend(&text, "\ncheckpoint { dir: \"", name, "\" every_n_steps: 10 }\n", extra, "\n");
  const std::string path = absl::StrCat(dir, "/", name, ".textproto");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

// The current pid of `name` ("controller", "worker-0", ...) by `baton up`'s
// log: its first, or the one it restarted last.
pid_t CurrentPid(const std::string& up_log, const std::string& name) {
  pid_t pid = 0;
  for (absl::string_view line : absl::StrSplit(up_log, '\n')) {
    int p = 0;
    if (absl::StartsWith(line, name + ": pid ") && absl::SimpleAtoi(line.substr(name.size() + 6), &p)) pid = p;
    if (absl::StartsWith(line, name + " restarted")) {
      const size_t at = line.rfind("(pid ");
      if (at != absl::string_view::npos && absl::SimpleAtoi(line.substr(at + 5, line.size() - at - 6), &p)) pid = p;
    }
  }
  return pid;
}

TEST(ChaosTest, TwentyFaultsAndTheJobFinishesBitForBit) {
  testing::ArmHardTimeout(absl::Seconds(800));
  const std::string dir = testing::TempDir("chaos");
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

  const std::string straight = id_of(cli({"submit", WriteJob(dir, "straight", "")}));
  auto straight_log = cli({"logs", straight, "--follow", "--output=json"}, absl::Seconds(300));
  ASSERT_EQ(straight_log.exit_code, 0) << straight_log.output;
  std::map<int, double> uninterrupted;
  for (const auto& line : JsonLines(straight_log.output)) uninterrupted[static_cast<int>(Field(line, "step"))] = Field(line, "loss");
  ASSERT_EQ(uninterrupted.size(), 200u);

  const char* seed_env = std::getenv("BATON_TEST_SEED");
  const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : absl::ToUnixNanos(absl::Now());
  std::mt19937_64 draw(seed);
  const std::string job = id_of(cli({"submit", WriteJob(dir, "chaos", "restart { max_restarts: 25 backoff_ms: 200 }")}));
  ASSERT_FALSE(job.empty());
  // A client per fault: the controller may be gone and back in between.
  auto status = [&]() -> absl::StatusOr<baton::v1::JobStatus> {
    auto c = Client::Connect(addr, absl::Seconds(2));
    if (!c.ok()) return c.status();
    return (*c)->GetJob(job);
  };
  int worker_kills = 0, worker_stops = 0, controller_kills = 0, last_step = 0;
  std::set<std::string> faulted;
  std::string timeline;
  for (int fault = 0; fault < 20; ++fault) {
    // Running, and a step further than at the last fault.
    baton::v1::JobStatus s;
    const absl::Time until = absl::Now() + absl::Seconds(90);
    while (absl::Now() < until) {
      auto j = status();
      if (j.ok()) s = *j;
      if (s.state() == baton::v1::JOB_RUNNING && s.step() > std::max(last_step, s.start_step())) break;
      if (s.state() == baton::v1::JOB_FINISHED || s.state() == baton::v1::JOB_FAILED) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(s.state(), baton::v1::JOB_RUNNING) << "fault " << fault << ":\n" << s.DebugString();
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 500)(draw)));
    last_step = s.step();
    const int kind = std::uniform_int_distribution<int>(0, 2)(draw);
    const std::string up_log = ReadFile(dir + "/up.log");
    if (kind == 2) {
      const pid_t pid = CurrentPid(up_log, "controller");
      ASSERT_GT(pid, 0);
      ASSERT_EQ(kill(pid, SIGKILL), 0);
      ++controller_kills;
      absl::StrAppend(&timeline, " C@", last_step);
      // Until it answers again.
      while (!Client::Connect(addr, absl::Milliseconds(200)).ok()) absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    const std::string victim = s.workers(std::uniform_int_distribution<int>(0, 1)(draw));
    const pid_t pid = CurrentPid(up_log, victim);
    ASSERT_GT(pid, 0);
    faulted.insert(victim);
    if (kind == 0) {
      ASSERT_EQ(kill(pid, SIGKILL), 0);
      ++worker_kills;
      absl::StrAppend(&timeline, " K", victim.substr(victim.size() - 1), "@", last_step);
    } else {
      ASSERT_EQ(kill(pid, SIGSTOP), 0);
      absl::SleepFor(absl::Seconds(10));
      ASSERT_EQ(kill(pid, SIGCONT), 0);
      ++worker_stops;
      absl::StrAppend(&timeline, " S", victim.substr(victim.size() - 1), "@", last_step);
    }
    // Each worker fault is one failure of the job: wait until it is recorded.
    const absl::Time recorded = absl::Now() + absl::Seconds(60);
    while (absl::Now() < recorded) {
      auto j = status();
      if (j.ok() && j->failures_size() >= worker_kills + worker_stops) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  auto resumed = cli({"logs", job, "--follow", "--output=json"}, absl::Seconds(300));
  auto final_status = status();
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  int lines = 0, identical = 0;
  for (const auto& line : JsonLines(resumed.output)) {
    const int step = static_cast<int>(Field(line, "step"));
    ++lines;
    identical += uninterrupted.count(step) && uninterrupted.at(step) == Field(line, "loss");
  }
  int named = 0;
  for (const auto& f : final_status->failures()) {
    for (const auto& w : faulted) {
      if (absl::StrContains(f.cause(), w)) {
        ++named;
        break;
      }
    }
  }
  std::printf("seed %llu: 20 faults (K = SIGKILL a worker, S = SIGSTOP one 10 s, C = SIGKILL the controller; @ the "
              "step):%s\n%s %s at step %d: %d restarts for %d worker faults (%d failures recorded, %d naming the "
              "worker), %d resumes for %d controller kills; %d of %d step lines (replayed ones included) "
              "bit-identical to the uninterrupted run; final loss %.9g vs %.9g\n",
              static_cast<unsigned long long>(seed), timeline.c_str(), job.c_str(),
              baton::v1::JobState_Name(final_status->state()).c_str(), final_status->step(), final_status->restarts(),
              worker_kills + worker_stops, final_status->failures_size(), named, final_status->resumes(),
              controller_kills, identical, lines, final_status->last().loss(), uninterrupted.at(200));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output.substr(0, 4000);
  EXPECT_EQ(final_status->state(), baton::v1::JOB_FINISHED) << final_status->error();
  EXPECT_EQ(final_status->step(), 200);
  EXPECT_EQ(final_status->failures_size(), worker_kills + worker_stops);
  EXPECT_EQ(named, final_status->failures_size());
  EXPECT_EQ(final_status->resumes(), controller_kills);
  EXPECT_EQ(identical, lines);
  EXPECT_EQ(final_status->last().loss(), uninterrupted.at(200));

  kill(up.pid, SIGTERM);
  EXPECT_EQ(testing::WaitBackground(up, absl::Seconds(30)), 0);
  // Every process baton up started - the restarted ones too - is gone.
  int processes = 0;
  for (absl::string_view line : absl::StrSplit(ReadFile(dir + "/up.log"), '\n')) {
    if (!absl::StartsWith(line, "controller") && !absl::StartsWith(line, "worker-")) continue;
    int pid = 0;
    if (const size_t at = line.find(": pid "); at != absl::string_view::npos) {
      absl::SimpleAtoi(line.substr(at + 6), &pid);
    } else if (const size_t open = line.rfind("(pid "); open != absl::string_view::npos &&
                                                         absl::StrContains(line, " restarted ")) {
      absl::SimpleAtoi(line.substr(open + 5, line.size() - open - 6), &pid);
    }
    if (pid > 0) {
      ++processes;
      EXPECT_TRUE(testing::ProcessGone(pid)) << line;
    }
  }
  std::printf("%d processes baton up started, every one gone\n", processes);
}

}  // namespace
}  // namespace baton
