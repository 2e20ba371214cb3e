// A controller that dies and comes back: `baton up` with its job table in a
// state directory; the controller SIGKILLed during a detached job that
// checkpoints every 5 steps and an attached `baton run`. `baton up` starts
// it again on the same port; the workers re-register within 3 s; the
// detached job resumes from the state its workers kept (not from its
// checkpoint: nothing from disk, no step lost) and finishes, its losses
// bit-identical to an uninterrupted run; the attached client's run ends
// naming the controller restart. (tests/controller_kill_test kills it 10
// times, and with a worker; a restore from checkpoints it shares a
// directory with another job's is checked there.)
//
// While the detached job runs, a third job naming its checkpoint directory
// is refused at submission.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"
#include "tests/up_fleet.h"

namespace baton {
namespace {

using testing::Field;
using testing::JsonLines;
using testing::ReadFile;
using testing::RunCommand;
using testing::Runfile;

std::string Baton() { return testing::BatonBinary(); }

std::string WriteJob(const testing::UpFleet& fleet, const std::string& name, int steps, const std::string& checkpoint) {
  return testing::WriteJobFile(
      fleet.dir, "decoder_fsdp2.textproto", name, steps,
      checkpoint.empty() ? "" : absl::StrCat("checkpoint { dir: \"", checkpoint, "\" every_n_steps: 5 }"));
}

TEST(RestartTest, ADetachedJobSurvivesTheControllerAndAnAttachedOneIsToldWhy) {
  // The status page on (a port of its choosing): it must stay there.
  testing::UpFleet fleet = testing::StartUpFleet("restart", 4, {"--http_port=0"});
  const std::string& dir = fleet.dir;
  const std::string addr = fleet.addr;
  ASSERT_FALSE(addr.empty()) << fleet.log();
  const pid_t controller = fleet.CurrentPid("controller");
  ASSERT_GT(controller, 0) << fleet.log();

  // The uninterrupted run, detached, to compare with.
  const int kSteps = 240;  // long enough that it still runs when the attached one reaches step 2
  const std::string straight = fleet.Submit(WriteJob(fleet, "straight", kSteps, "straight"));
  auto straight_log = fleet.Cli({"logs", straight, "--follow", "--output=json"}, absl::Seconds(180));
  ASSERT_EQ(straight_log.exit_code, 0) << straight_log.output;
  const std::map<int, double> uninterrupted = testing::StepLosses(straight_log.output);
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kSteps));

  // The same job again, in the finished run's directory, and an attached
  // run beside it.
  const std::string detached = fleet.Submit(WriteJob(fleet, "detached", kSteps, "straight"));
  ASSERT_FALSE(detached.empty());
  auto sharing = fleet.Cli({"submit", WriteJob(fleet, "sharing", kSteps, "straight")});
  std::printf("a third job in that directory while %s runs: exit %d: %s", detached.c_str(), sharing.exit_code,
              sharing.output.c_str());
  EXPECT_NE(sharing.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(sharing.output, "is in use by job " + detached)) << sharing.output;
  auto attached = testing::StartBackground(
      {Baton(), "run", "--controller=" + addr, WriteJob(fleet, "attached", 100000, "")}, dir + "/attached.log");
  // Followed from before the kill to the end: every step printed once, and
  // the requeue line between.
  auto follower = testing::StartBackground(
      {Baton(), "logs", detached, "--follow", "--output=json", "--controller=" + addr}, dir + "/follow.log");
  auto client = Client::Connect(addr);
  ASSERT_TRUE(client.ok());
  auto step_of = [&](const std::string& id) {
    auto job = (*client)->GetJob(id);
    return job.ok() ? job->step() : -1;
  };
  const absl::Time wait_until = absl::Now() + absl::Seconds(60);
  while ((step_of(detached) < 12 || !absl::StrContains(ReadFile(dir + "/attached.log"), "step    2/")) &&
         absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  auto before = (*client)->Status();
  const std::string http_before = before.ok() ? before->http_address() : "";
  const int killed_at = step_of(detached);
  ASSERT_GE(killed_at, 12);
  ASSERT_LT(killed_at, kSteps) << "the job ended before the kill";

  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(controller, SIGKILL), 0);
  // `baton up` starts it again on the same address.
  // Fresh connections, so the time is the controller's, not a channel's
  // backoff.
  auto answers = [&] {
    auto c = Client::Connect(addr, absl::Milliseconds(200));
    return c.ok() && (*c)->Status().ok();
  };
  while (!answers() && absl::Now() - killed < absl::Seconds(30)) absl::SleepFor(absl::Milliseconds(20));
  const absl::Time answered = absl::Now();
  auto again = Client::Connect(addr, absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  int registered = 0;
  while (absl::Now() - answered < absl::Seconds(15)) {
    auto status = (*again)->Status();
    registered = 0;
    if (status.ok()) {
      for (const auto& w : status->workers()) registered += w.state() != baton::v1::DEAD;
    }
    if (registered == 4) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double back_s = absl::ToDoubleSeconds(absl::Now() - answered);
  auto after_restart = (*again)->Status();
  const std::string http_after = after_restart.ok() ? after_restart->http_address() : "";
  std::printf("status page before the kill: %s; after the restart: %s\n", http_before.c_str(), http_after.c_str());
  EXPECT_FALSE(http_before.empty());
  EXPECT_EQ(http_after, http_before) << "the printed status page address went stale";
  std::printf("controller SIGKILLed at step %d of %s; answering again %.2f s later; all 4 workers re-registered %.2f s "
              "after that (limit 3.0 s)\n",
              killed_at, detached.c_str(), absl::ToDoubleSeconds(answered - killed), back_s);
  EXPECT_EQ(registered, 4);
  EXPECT_LE(back_s, 3.0);
  for (absl::string_view line : absl::StrSplit(fleet.log(), '\n')) {
    if (absl::StrContains(line, "controller") && !absl::StartsWith(line, "event")) std::printf("  up: %s\n", std::string(line).c_str());
  }

  // The detached job resumes from the state its workers kept and finishes.
  auto resumed = fleet.Cli({"logs", detached, "--follow", "--output=json"}, absl::Seconds(180));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  const size_t requeued = resumed.output.find("\"resumes\":1");
  ASSERT_NE(requeued, std::string::npos) << resumed.output;
  const std::map<int, double> after = testing::StepLosses(resumed.output.substr(requeued));
  ASSERT_FALSE(after.empty());
  int identical = 0;
  for (const auto& [step, loss] : after) identical += uninterrupted.count(step) && uninterrupted.at(step) == loss;
  auto ended = (*again)->GetJob(detached);
  ASSERT_TRUE(ended.ok()) << ended.status();
  const baton::v1::CheckpointInfo& from = ended->restored();
  std::printf("%s resumed at step %d (killed at step %d) %s: %lld B kept in place, %lld B from disk, %d steps redone, "
              "%d recorded from the workers' figures; steps %d-%d logged after the requeue, %d of %zu losses "
              "bit-identical to the uninterrupted run\n",
              detached.c_str(), from.step(), killed_at, from.from_peers() ? "from its workers" : from.path().c_str(),
              static_cast<long long>(from.bytes_local()), static_cast<long long>(from.bytes()), from.steps_redone(),
              from.steps_recovered(), after.begin()->first, after.rbegin()->first, identical, after.size());
  EXPECT_TRUE(from.from_peers());
  EXPECT_EQ(from.bytes(), 0);
  EXPECT_GE(from.step(), killed_at);
  EXPECT_LE(from.steps_redone(), 1);
  EXPECT_EQ(after.rbegin()->first, kSteps);
  EXPECT_EQ(identical, static_cast<int>(after.size()));

  bool follow_timed_out = false;
  const int follow_code = testing::WaitBackground(follower, absl::Seconds(60), &follow_timed_out);
  const std::string followed = ReadFile(dir + "/follow.log");
  const size_t step_lines = JsonLines(followed).size();
  const std::map<int, double> followed_steps = testing::StepLosses(followed);
  int followed_identical = 0;
  for (const auto& [step, loss] : followed_steps) {
    followed_identical += uninterrupted.count(step) && uninterrupted.at(step) == loss;
  }
  const bool requeue_line = absl::StrContains(followed, "requeued after a controller restart");
  std::printf("baton logs --follow across the restart: exit %d%s, %zu step lines, %zu distinct steps (of %d), %d "
              "bit-identical to the uninterrupted run; the requeue line %s\n",
              follow_code, follow_timed_out ? " (timed out)" : "", step_lines, followed_steps.size(), kSteps,
              followed_identical, requeue_line ? "printed" : "MISSING");
  EXPECT_EQ(follow_code, 0);
  EXPECT_EQ(step_lines, static_cast<size_t>(kSteps));
  EXPECT_EQ(followed_steps.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(followed_identical, kSteps);
  EXPECT_TRUE(requeue_line);

  // The attached client: its run ends, naming the restart.
  bool timed_out = false;
  const int code = testing::WaitBackground(attached, absl::Seconds(40), &timed_out);
  const std::string attached_log = ReadFile(dir + "/attached.log");
  std::printf("attached baton run: exit %d%s: %s", code, timed_out ? " (timed out)" : "",
              attached_log.substr(attached_log.rfind("baton run:") == std::string::npos ? 0 : attached_log.rfind("baton run:"))
                  .c_str());
  EXPECT_FALSE(timed_out);
  EXPECT_NE(code, 0);
  EXPECT_TRUE(absl::StrContains(attached_log, "controller restarted")) << attached_log;

  EXPECT_EQ(fleet.Stop(), 0);
  for (const pid_t p : fleet.AllPids()) EXPECT_TRUE(testing::ProcessGone(p)) << "pid " << p << " left behind";
  EXPECT_TRUE(absl::StrContains(fleet.log(), "controller restarted on " + addr)) << fleet.log();
}

}  // namespace
}  // namespace baton
