// Live rescale (issue 17), through real daemons under `baton up`: an FSDP
// job rescaled dp=2 -> dp=4 -> dp=2 mid-job (`baton rescale` and the SDK).
// Every piece of model and optimizer state moves worker to worker, 0 bytes
// through disk; the losses equal, within 1e-5, a job resumed from
// checkpoints on the same meshes at the same steps; the bytes moved are
// printed next to the model state's size. (The restore from live replicas
// after a failure: recovery_test's HSDP case.)
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "client/client.h"
#include "tests/cluster_util.h"
#include "tests/step_lines.h"
#include "tests/up_fleet.h"

namespace baton {
namespace {


// Waits until `cond` holds for the job's status (or `timeout`); the last status.
baton::v1::JobStatus Await(Client& client, const std::string& job,
                           const std::function<bool(const baton::v1::JobStatus&)>& cond, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  baton::v1::JobStatus s;
  while (absl::Now() < until) {
    auto j = client.GetJob(job);
    if (j.ok()) s = *j;
    if (cond(s)) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return s;
}

// examples/decoder_fsdp2 with its dp axis of size `size`, `steps` steps and `extra`.
std::string DpJob(const testing::UpFleet& fleet, const std::string& name, int size, int steps, const std::string& extra) {
  const std::string path = testing::WriteJobFile(fleet.dir, "decoder_fsdp2.textproto", name, steps, extra);
  std::string text = testing::ReadFile(path);
  const std::string two = "mesh { name: \"dp\" size: 2 }";
  text.replace(text.find(two), two.size(), absl::StrCat("mesh { name: \"dp\" size: ", size, " }"));
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

TEST(RescaleTest, RescaleTwoFourTwoMovesStateWorkerToWorker) {
  testing::UpFleet fleet = testing::StartUpFleet("live_rescale", 4);
  ASSERT_FALSE(fleet.addr.empty()) << fleet.log();
  auto client = Client::Connect(fleet.addr);
  ASSERT_TRUE(client.ok()) << client.status();
  // A small model: its steps take milliseconds, and a detached job runs a
  // second's worth per call. A rescale waits for the calls on the wire (up
  // to two seconds): enough steps that the job still runs after both.
  const int kSteps = 1200;
  const std::string job = fleet.Submit(DpJob(fleet, "elastic", 2, kSteps, ""));
  ASSERT_FALSE(job.empty());
  Await(**client, job, [](const auto& s) { return s.step() >= 8; }, absl::Seconds(60));
  // Up through the CLI...
  auto up = fleet.Cli({"rescale", job, "--mesh=dp=4"}, absl::Seconds(120));
  ASSERT_EQ(up.exit_code, 0) << up.output << fleet.log();
  std::printf("baton rescale %s --mesh=dp=4: %s", job.c_str(), up.output.c_str());
  baton::v1::JobStatus s = *(*client)->GetJob(job);
  const int up_at = s.start_step();
  const baton::v1::CheckpointInfo grown = s.restored();
  ASSERT_EQ(s.workers_size(), 4);
  // ... and down through the SDK, asked twice at once: one is applied, the
  // other refused at once (one rescale at a time), neither left waiting.
  Await(**client, job, [&](const auto& s) { return s.step() >= up_at + 8; }, absl::Seconds(60));
  absl::StatusOr<baton::v1::JobStatus> answers[2];
  double seconds[2] = {0, 0};
  {
    absl::Notification go;
    std::vector<std::thread> callers;
    for (int i = 0; i < 2; ++i) {
      callers.emplace_back([&, i] {
        auto own = Client::Connect(fleet.addr);
        go.WaitForNotification();
        const absl::Time asked = absl::Now();
        answers[i] = own.ok() ? (*own)->RescaleJob(job, "dp=2", absl::Seconds(120)) : own.status();
        seconds[i] = absl::ToDoubleSeconds(absl::Now() - asked);
      });
    }
    go.Notify();
    for (auto& t : callers) t.join();
  }
  const int applied = answers[0].ok() ? 0 : 1;
  const absl::Status& other = answers[1 - applied].status();
  std::printf("two rescales to dp=2 at once: one applied in %.2f s; the other answered in %.2f s: %s\n",
              seconds[applied], seconds[1 - applied], other.ToString().c_str());
  ASSERT_TRUE(answers[applied].ok()) << answers[applied].status() << fleet.log();
  EXPECT_FALSE(other.ok());
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(other.message(), "already being rescaled")) << other;
  EXPECT_LT(std::max(seconds[0], seconds[1]), 5.0);
  const absl::StatusOr<baton::v1::JobStatus>& down = answers[applied];
  const int down_at = down->start_step();
  const baton::v1::CheckpointInfo shrunk = down->restored();
  EXPECT_EQ(down->workers_size(), 2);
  auto followed = fleet.Follow(job);
  ASSERT_EQ(followed.exit_code, 0) << followed.output;
  const std::map<int, double> live = testing::StepLosses(followed.output);
  s = *(*client)->GetJob(job);
  EXPECT_EQ(s.state(), baton::v1::JOB_FINISHED) << s.error();
  EXPECT_EQ(s.restarts(), 0);

  // The reference: the same steps on the same meshes, through checkpoints.
  auto run = [&](const std::string& name, int size, int steps, const std::string& resume) {
    std::string extra = absl::StrCat("checkpoint { dir: \"", name, "\" every_n_steps: ", steps, " }");
    if (!resume.empty()) absl::StrAppend(&extra, "\nresume_from: \"", resume, "\"");
    const std::string id = fleet.Submit(DpJob(fleet, name, size, steps, extra));
    auto log = fleet.Follow(id);
    EXPECT_EQ(log.exit_code, 0) << log.output;
    return std::make_pair(testing::StepLosses(log.output), absl::StrCat(fleet.dir, "/root/", name));
  };
  auto [first, first_dir] = run("ref_dp2", 2, up_at, "");
  auto [second, second_dir] = run("ref_dp4", 4, down_at, "ref_dp2");
  auto [third, third_dir] = run("ref_dp2_again", 2, kSteps, "ref_dp4");
  std::map<int, double> expected = first;
  for (const auto& [step, loss] : second) expected[step] = loss;
  for (const auto& [step, loss] : third) expected[step] = loss;
  const auto [worst, compared] = testing::CompareLosses(live, expected);
  auto metadata = ReadMetadata(FindCheckpoint(first_dir).value_or(""));
  const int64_t state_bytes = metadata.ok() ? metadata->total_bytes() : -1;
  std::printf("rescaled dp=2 -> dp=4 at step %d: %lld bytes worker to worker, %lld kept in place, %lld from disk; "
              "dp=4 -> dp=2 at step %d: %lld worker to worker, %lld kept in place, %lld from disk; the model state "
              "(parameters and AdamW moments, as a checkpoint holds them once) is %lld bytes; %d steps compared with "
              "a job resumed from checkpoints on the same meshes: worst relative difference %.3g\n",
              up_at, static_cast<long long>(grown.bytes_from_peers()), static_cast<long long>(grown.bytes_local()),
              static_cast<long long>(grown.bytes()), down_at, static_cast<long long>(shrunk.bytes_from_peers()),
              static_cast<long long>(shrunk.bytes_local()), static_cast<long long>(shrunk.bytes()),
              static_cast<long long>(state_bytes), compared, worst);
  EXPECT_TRUE(grown.from_peers());
  EXPECT_TRUE(shrunk.from_peers());
  EXPECT_EQ(grown.bytes(), 0);
  EXPECT_EQ(shrunk.bytes(), 0);
  EXPECT_GT(grown.bytes_from_peers(), 0);
  EXPECT_GT(shrunk.bytes_from_peers(), 0);
  EXPECT_GE(grown.bytes_from_peers() + grown.bytes_local(), state_bytes);
  EXPECT_EQ(compared, kSteps);
  EXPECT_LE(worst, 1e-5);
  EXPECT_EQ(fleet.Stop(), 0);
  for (const pid_t p : fleet.AllPids()) EXPECT_TRUE(testing::ProcessGone(p)) << "pid " << p << " left behind";
}

}  // namespace
}  // namespace baton
