// Survivors never die of a peer's death (issue 17): `baton up` with 4
// workers (dead ones restarted under their names); round after round a
// worker is SIGKILLed at a random moment of a large-tensor `baton check
// --mesh dp=2,tp=2` or of a 1F1B pipeline job's steps (the job restarts
// each time). Counted from `baton up`'s record of every process that ended:
// the processes that ended without being killed by the test - surviving
// workers that died - must be none. Rounds: $BATON_SURVIVOR_ROUNDS per kind
// (20 by default; the 300 are run by hand the same way).
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
#include "tests/up_fleet.h"

namespace baton {
namespace {


// The worker processes `baton up` saw end (its log: "worker-1 (pid 40)
// killed by signal 9 (Killed)"), by pid.
std::map<pid_t, std::string> EndedWorkers(const std::string& up_log) {
  std::map<pid_t, std::string> ended;
  for (absl::string_view line : absl::StrSplit(up_log, '\n')) {
    // "NAME (pid N) how it ended", not "NAME restarted (pid N)".
    const size_t at = line.find(" (pid ");
    if (!absl::StartsWith(line, "worker-") || at == absl::string_view::npos || at != line.find(' ')) continue;
    const size_t close = line.find(')', at);
    int pid = 0;
    if (close != absl::string_view::npos && absl::SimpleAtoi(line.substr(at + 6, close - at - 6), &pid)) {
      ended[pid] = std::string(line);
    }
  }
  return ended;
}

class SurvivorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fleet_ = testing::StartUpFleet("survivors", 4);
    addr_ = fleet_.addr;
    ASSERT_FALSE(addr_.empty()) << fleet_.log();
    auto client = Client::Connect(addr_);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    const char* rounds = std::getenv("BATON_SURVIVOR_ROUNDS");
    if (rounds != nullptr) rounds_ = std::max(1, atoi(rounds));
    // A round takes a few seconds (a killed worker restarts and loads), more
    // beside other tests' builds on a loaded machine: CI saw 13 s a round.
    testing::ArmHardTimeout(absl::Seconds(120 + 25 * rounds_));
    seed_ = testing::TestSeed();
  }
  void TearDown() override { fleet_.Stop(); }

  // Waits until all 4 workers are alive in their current processes: each
  // registered by the instance `baton up` started last (a killed one's
  // successor), none DEAD.
  bool AwaitFleet(absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    while (absl::Now() < until) {
      auto s = client_->Status();
      int alive = 0;
      if (s.ok()) {
        for (const auto& w : s->workers()) {
          alive += w.state() != baton::v1::DEAD && w.pid() == fleet_.CurrentPid(w.name());
        }
      }
      if (alive == 4) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Kills worker `name`'s current process; returns its pid.
  pid_t Kill(const std::string& name) {
    const pid_t pid = fleet_.CurrentPid(name);
    if (pid > 0) kill(pid, SIGKILL);
    killed_.insert(pid);
    return pid;
  }

  // Worker processes that ended without the test killing them.
  std::vector<std::string> SurvivorDeaths() {
    std::vector<std::string> out;
    for (const auto& [pid, line] : EndedWorkers(fleet_.log())) {
      if (!killed_.count(pid)) out.push_back(line);
    }
    return out;
  }

  testing::UpFleet fleet_;
  std::string addr_;
  std::unique_ptr<Client> client_;
  int rounds_ = 20;
  uint64_t seed_ = 0;
  std::set<pid_t> killed_;
};

TEST_F(SurvivorsTest, NoSurvivorDiesOfAPeerKilledDuringALargeCheck) {
  std::mt19937_64 draw(seed_);
  int checks_failed = 0;
  for (int round = 0; round < rounds_; ++round) {
    ASSERT_TRUE(AwaitFleet(absl::Seconds(30))) << "round " << round << ":\n" << fleet_.log();
    auto check = testing::StartBackground({testing::BatonBinary(), "check", "--controller=" + addr_, "--mesh=dp=2,tp=2",
                                           "--numel=4194304", "--iters=2", "--timeout_ms=20000"},
                                          absl::StrCat(fleet_.dir, "/check-", round, ".log"));
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
  const std::string job = fleet_.Submit(testing::WriteJobFile(fleet_.dir, "decoder_pp4_1f1b.textproto", "pipeline",
                                                              1000000, "restart { max_restarts: 1000 backoff_ms: 50 }"));
  ASSERT_FALSE(job.empty());
  for (int round = 0; round < rounds_; ++round) {
    const absl::Time round_start = absl::Now();
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
    // The pid to kill is the one `baton up` started last: its log may name
    // a restarted worker a moment after the worker registered (killing the
    // dead predecessor's pid again would fail nothing and the round would
    // wait 30 s for a failure that never comes).
    ASSERT_TRUE(AwaitFleet(absl::Seconds(30))) << "round " << round << ":\n" << fleet_.log();
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 300)(draw)));
    // Still stepping on that mesh (not re-forming it: a kill then is not
    // "during a step"), and how many failures it had before this kill.
    auto now = client_->GetJob(job);
    ASSERT_TRUE(now.ok());
    if (now->state() != baton::v1::JOB_RUNNING || now->mesh_id() != s.mesh_id()) {
      --round;
      continue;
    }
    const int failures_before = now->failures_size();
    Kill(s.workers(std::uniform_int_distribution<int>(0, 3)(draw)));
    const absl::Time killed = absl::Now(), noticed = killed + absl::Seconds(30);
    while (absl::Now() < noticed) {
      auto j = client_->GetJob(job);
      if (j.ok() && j->failures_size() > failures_before) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    const double noticed_s = absl::ToDoubleSeconds(absl::Now() - killed);
    if (round < 3 || std::getenv("BATON_SURVIVOR_VERBOSE") != nullptr) {
      std::printf("round %d: killed at step %d; its failure recorded %.2f s later; the round took %.2f s\n", round,
                  s.step(), noticed_s, absl::ToDoubleSeconds(absl::Now() - round_start));
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
  // Every kill failed the job once (a rare step may fail of itself on a
  // fresh mesh as well: seen once in 300 rounds, a connection closed at
  // step 1).
  EXPECT_GE(final_status->restarts(), rounds_);
}

}  // namespace
}  // namespace baton
