// A worker SIGKILLed, through the real baton, baton-controller and
// baton-worker binaries on loopback: shown DEAD, named by the checks it
// fails, replaced under its name; and killed while a check runs. Hard
// timeouts (tests/cluster_util), port 0, nothing left behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

using testing::AwaitGone;
using testing::PidOf;
using testing::Runfile;
using testing::RunCommand;
using testing::StartCluster;

std::string Baton() { return testing::BatonBinary(); }
void ExpectAllGone(LocalCluster& cluster) { testing::StopAndExpectAllGone(cluster); }

// `name`'s entry in the controller's status; none while it cannot be read.
std::optional<baton::v1::WorkerInfo> WorkerInStatus(Client& client, const std::string& name) {
  auto status = client.Status();
  if (!status.ok()) return std::nullopt;
  for (const auto& w : status->workers()) {
    if (w.name() == name) return w;
  }
  return std::nullopt;
}

// Whether `baton status`'s `output` has a line for `worker` holding every one of `words`.
bool StatusLineHas(const std::string& output, const std::string& worker,
                   std::initializer_list<absl::string_view> words) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(line, worker + " ")) continue;
    bool all = true;
    for (absl::string_view w : words) all = all && absl::StrContains(line, w);
    if (all) return true;
  }
  return false;
}

// SIGKILL a worker: DEAD in `baton status` within 5 s, and a check started
// afterwards fails within 10 s naming the worker and its rank. The survivors
// keep serving.
TEST(ClusterTest, KilledWorkerIsDeadWithinFiveSecondsAndNamedByCheck) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const std::string address = cluster->controller_address();
  auto warmup = RunCommand({Baton(), "check", "--controller=" + address, "--mesh=dp=2,tp=2",
                            "--numel=1024", "--iters=1"},
                           absl::Seconds(60));
  ASSERT_EQ(warmup.exit_code, 0) << warmup.output;

  // When the controller's status says DEAD, timed through the client SDK
  // (a CLI process per poll would add its start-up to the figure); then
  // `baton status` shows it.
  auto client = Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(PidOf(*cluster, "worker-2"), SIGKILL), 0);
  double dead_after = -1;
  while (dead_after < 0 && absl::Now() - killed < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(50));
    if (auto w = WorkerInStatus(**client, "worker-2"); w && w->state() == baton::v1::DEAD) {
      dead_after = absl::ToDoubleSeconds(absl::Now() - killed);
    }
  }
  auto shown = RunCommand({Baton(), "status", "--controller=" + address}, absl::Seconds(10));
  const bool cli_dead = StatusLineHas(shown.output, "worker-2", {"DEAD"});
  std::printf("worker-2 DEAD %.2f s after SIGKILL; `baton status` shows it: %s\n", dead_after,
              cli_dead ? "yes" : "no");
  EXPECT_GE(dead_after, 0);
  EXPECT_LT(dead_after, 5.0);
  EXPECT_TRUE(cli_dead) << shown.output;

  auto check = RunCommand({Baton(), "check", "--controller=" + address, "--mesh=dp=2,tp=2",
                           "--numel=1024", "--iters=1"},
                          absl::Seconds(30));
  std::printf("check after the kill: exit %d after %.2f s: %s", check.exit_code, check.seconds,
              check.output.c_str());
  EXPECT_EQ(check.exit_code, 1);
  EXPECT_LT(check.seconds, 10.0);
  EXPECT_TRUE(absl::StrContains(check.output, "worker-2")) << check.output;
  EXPECT_TRUE(absl::StrContains(check.output, "rank 2")) << check.output;

  // The three survivors still form a mesh and pass.
  auto smaller = RunCommand({Baton(), "check", "--controller=" + address, "--mesh=dp=3",
                             "--numel=1024", "--iters=1"},
                            absl::Seconds(60));
  EXPECT_EQ(smaller.exit_code, 0) << smaller.output;

  // A replacement with the same name takes the dead worker's rank back and
  // the full mesh works again.
  const std::string dir = testing::TempDir("replacement");
  auto replacement = testing::StartBackground(
      {Runfile("worker/baton-worker"), "--controller=" + address, "--name=worker-2", "--port=0",
       "--worker_token_file=" + cluster->worker_token_file()},
      dir + "/worker.log");
  bool rejoined = false;
  for (int i = 0; i < 100 && !rejoined; ++i) {
    auto status = RunCommand({Baton(), "status", "--controller=" + address}, absl::Seconds(5));
    rejoined = StatusLineHas(status.output, "worker-2", {"REGISTERED", "    2  "});
    if (!rejoined) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(rejoined) << testing::ReadFile(dir + "/worker.log");
  auto full = RunCommand({Baton(), "check", "--controller=" + address, "--mesh=dp=2,tp=2",
                          "--numel=1024", "--iters=1"},
                         absl::Seconds(60));
  std::printf("check with the replacement worker-2: exit %d\n", full.exit_code);
  EXPECT_EQ(full.exit_code, 0) << full.output;
  kill(replacement.pid, SIGTERM);
  EXPECT_EQ(testing::WaitBackground(replacement, absl::Seconds(10)), 0);
  EXPECT_TRUE(AwaitGone(replacement.pid, absl::Seconds(1)));
  ExpectAllGone(*cluster);
}

// A worker killed while a long check runs: the check fails within 10 s and
// names the worker and its rank.
TEST(ClusterTest, WorkerKilledDuringCheckFailsItWithinTenSeconds) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const std::string dir = testing::TempDir("running");
  auto check = testing::StartBackground(
      {Baton(), "check", "--controller=" + cluster->controller_address(), "--mesh=dp=2,tp=2",
       "--numel=1048576", "--iters=100"},
      dir + "/check.log");
  // The mesh is formed (its workers held) and collectives run.
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto held = [&] {
    auto w = WorkerInStatus(**client, "worker-3");
    return w && !w->held_by().empty();
  };
  const absl::Time asked = absl::Now();
  while (!held() && absl::Now() < asked + absl::Seconds(30)) absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(PidOf(*cluster, "worker-3"), SIGKILL), 0);
  bool timed_out = true;
  int code = testing::WaitBackground(check, absl::Seconds(30), &timed_out);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - killed);
  const std::string output = testing::ReadFile(dir + "/check.log");
  std::printf("check ended %.2f s after the kill with exit %d: %s", seconds, code, output.c_str());
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(code, 1);
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(absl::StrContains(output, "worker-3")) << output;
  EXPECT_TRUE(absl::StrContains(output, "rank 3")) << output;
  ExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
