// Survivors never die of a peer's death (issue 17): `baton up` with 4
// workers (dead ones restarted under their names); round after round a
// worker is SIGKILLed at a random moment of a large-tensor `baton check
// --mesh dp=2,tp=2` or of a 1F1B pipeline job's steps (the job restarts
// each time). Counted from `baton up`'s record of every process that ended:
// the processes that ended without being killed by the test - surviving
// workers that died - must be none. Rounds: $BATON_SURVIVOR_ROUNDS per kind
// (25 by default; the 300 are run by hand the same way).
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

namespace baton {
namespace {

using testing::ReadFile;
using testing::Runfile;

// Every worker process `baton up` started, by name: its current pid, and
// the pids that ended (with how).
struct Fleet {
  std::map<std::string, pid_t> current;
  std::map<pid_t, std::string> ended;
};

Fleet ReadFleet(const std::string& up_log) {
  Fleet f;
  for (absl::string_view line : absl::StrSplit(up_log, '\n')) {
    int pid = 0;
    if (absl::StartsWith(line, "worker-") && absl::StrContains(line, ": pid ")) {  // "worker-0: pid 12"
      const size_t at = line.find(": pid ");
      if (absl::SimpleAtoi(line.substr(at + 6), &pid)) f.current[std::string(line.substr(0, at))] = pid;
    } else if (absl::StrContains(line, " restarted (pid ")) {  // "worker-1 restarted (pid 40)"
      const size_t at = line.find(" restarted (pid ");
      if (absl::SimpleAtoi(line.substr(at + 16, line.size() - at - 17), &pid)) {
        f.current[std::string(line.substr(0, at))] = pid;
      }
    } else if (absl::StartsWith(line, "worker-") && absl::StrContains(line, " (pid ")) {  // "worker-1 (pid 40) killed by signal 9 (Killed)"
      const size_t at = line.find(" (pid ");
      const size_t close = line.find(')', at);
      if (close != absl::string_view::npos && absl::SimpleAtoi(line.substr(at + 6, close - at - 6), &pid)) {
        f.ended[pid] = std::string(line);
      }
    }
  }
  return f;
}

class SurvivorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("survivors");
    const std::string root = dir_ + "/root";
    ASSERT_EQ(system(absl::StrCat("mkdir -p ", root).c_str()), 0);
    setenv("BATON_TOKEN_FILE", (dir_ + "/client.token").c_str(), 1);
    up_ = testing::StartBackground(
        {testing::BatonBinary(), "up", "--workers=4", "--address_file=" + dir_ + "/addr", "--checkpoint_root=" + root,
         "--http_port=-1", "--controller_bin=" + Runfile("controller/baton-controller"),
         "--worker_bin=" + Runfile("worker/baton-worker")},
        dir_ + "/up.log");
    addr_ = testing::AwaitLine(dir_ + "/addr", absl::Seconds(60));
    ASSERT_FALSE(addr_.empty()) << ReadFile(dir_ + "/up.log");
    auto client = Client::Connect(addr_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    const char* rounds = std::getenv("BATON_SURVIVOR_ROUNDS");
    if (rounds != nullptr) rounds_ = std::max(1, atoi(rounds));
    // A round takes a few seconds (a killed worker restarts and loads).
    testing::ArmHardTimeout(absl::Seconds(std::max(280, 120 + 8 * rounds_)));
    const char* seed = std::getenv("BATON_TEST_SEED");
    seed_ = seed != nullptr ? std::strtoull(seed, nullptr, 10) : absl::ToUnixNanos(absl::Now());
  }
  void TearDown() override {
    if (up_.pid > 0) {
      kill(up_.pid, SIGTERM);
      testing::WaitBackground(up_, absl::Seconds(20));
    }
  }

  // Waits until all 4 workers are registered and alive.
  bool AwaitFleet(absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    while (absl::Now() < until) {
      auto s = client_->Status();
      int alive = 0;
      if (s.ok()) {
        for (const auto& w : s->workers()) alive += w.state() != baton::v1::DEAD;
      }
      if (alive == 4) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Kills worker `name`'s current process; returns its pid.
  pid_t Kill(const std::string& name) {
    const pid_t pid = ReadFleet(ReadFile(dir_ + "/up.log")).current[name];
    if (pid > 0) kill(pid, SIGKILL);
    killed_.insert(pid);
    return pid;
  }

  // Worker processes that ended without the test killing them.
  std::vector<std::string> SurvivorDeaths() {
    std::vector<std::string> out;
    for (const auto& [pid, line] : ReadFleet(ReadFile(dir_ + "/up.log")).ended) {
      if (!killed_.count(pid)) out.push_back(line);
    }
    return out;
  }

  std::string dir_, addr_;
  testing::Background up_;
  std::unique_ptr<Client> client_;
  int rounds_ = 25;
  uint64_t seed_ = 0;
  std::set<pid_t> killed_;
};

TEST_F(SurvivorsTest, NoSurvivorDiesOfAPeerKilledDuringALargeCheck) {
  std::mt19937_64 draw(seed_);
  int checks_failed = 0;
  for (int round = 0; round < rounds_; ++round) {
    ASSERT_TRUE(AwaitFleet(absl::Seconds(30))) << "round " << round << ":\n" << ReadFile(dir_ + "/up.log");
    auto check = testing::StartBackground({testing::BatonBinary(), "check", "--controller=" + addr_, "--mesh=dp=2,tp=2",
                                           "--numel=4194304", "--iters=2", "--timeout_ms=20000"},
                                          absl::StrCat(dir_, "/check-", round, ".log"));
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 1500)(draw)));
    Kill(absl::StrCat("worker-", std::uniform_int_distribution<int>(0, 3)(draw)));
    bool timed_out = false;
    checks_failed += testing::WaitBackground(check, absl::Seconds(60), &timed_out) != 0;
    ASSERT_FALSE(timed_out) << "round " << round << ": baton check hung";
  }
  ASSERT_TRUE(AwaitFleet(absl::Seconds(30)));
  const std::vector<std::string> deaths = SurvivorDeaths();
  std::printf("seed %llu: %d rounds of SIGKILLing a worker during baton check --mesh dp=2,tp=2 --numel 4194304 "
              "(%d checks failed, the rest were done first): %zu worker processes killed, %zu surviving workers "
              "died\n",
              static_cast<unsigned long long>(seed_), rounds_, checks_failed, killed_.size(), deaths.size());
  for (const auto& d : deaths) std::printf("  %s\n", d.c_str());
  EXPECT_TRUE(deaths.empty());
}

TEST_F(SurvivorsTest, NoSurvivorDiesOfAPeerKilledDuringAPipelineStep) {
  std::mt19937_64 draw(seed_);
  std::string text = ReadFile(Runfile("examples/decoder_pp4_1f1b.textproto"));
  text.replace(text.find("steps: 10"), 9, "steps: 1000000");
  absl::StrAppend(&text, "\nrestart { max_restarts: 1000 backoff_ms: 50 }\n");
  const std::string path = dir_ + "/pipeline.textproto";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  auto submitted = testing::RunCommand({testing::BatonBinary(), "submit", path, "--controller=" + addr_}, absl::Seconds(60));
  std::vector<std::string> out = absl::StrSplit(submitted.output, '\n', absl::SkipEmpty());
  ASSERT_FALSE(out.empty()) << submitted.output;
  const std::string job = out.back();
  for (int round = 0; round < rounds_; ++round) {
    // Running, a step past where it started.
    const absl::Time until = absl::Now() + absl::Seconds(60);
    baton::v1::JobStatus s;
    while (absl::Now() < until) {
      auto j = client_->GetJob(job);
      if (j.ok()) s = *j;
      if (s.state() == baton::v1::JOB_RUNNING && s.step() > s.start_step()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(s.state(), baton::v1::JOB_RUNNING) << "round " << round << ": " << s.DebugString();
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 300)(draw)));
    Kill(s.workers(std::uniform_int_distribution<int>(0, 3)(draw)));
    const absl::Time noticed = absl::Now() + absl::Seconds(30);
    while (absl::Now() < noticed) {
      auto j = client_->GetJob(job);
      if (j.ok() && j->failures_size() > round) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  auto final_status = client_->GetJob(job);
  ASSERT_TRUE(final_status.ok());
  client_->StopJob(job).IgnoreError();
  ASSERT_TRUE(AwaitFleet(absl::Seconds(30)));
  const std::vector<std::string> deaths = SurvivorDeaths();
  std::printf("seed %llu: %d rounds of SIGKILLing a worker during a 1F1B pp=4 job's steps (%d restarts, at step %d): "
              "%zu worker processes killed, %zu surviving workers died\n",
              static_cast<unsigned long long>(seed_), rounds_, final_status->restarts(), final_status->step(),
              killed_.size(), deaths.size());
  for (const auto& d : deaths) std::printf("  %s\n", d.c_str());
  EXPECT_TRUE(deaths.empty());
  EXPECT_EQ(final_status->restarts(), rounds_);
}

}  // namespace
}  // namespace baton
