// Failures of an attached job through real daemons: a worker killed mid-job,
// a pipeline stage killed mid-schedule, a silent worker - each ends the run
// naming the worker, at once, and leaves nothing behind. (The rest of
// JobTest is in job_test.cc.)
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"
#include "strategies/job_spec.h"
#include "strategies/planner.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::Runfile;
using testing::RunCommand;

using testing::StartCluster;
using testing::StopAndExpectAllGone;

std::string Baton() { return testing::BatonBinary(); }

using testing::Field;
using testing::JsonLines;

// What became of a `baton run` of the demo job after worker-1 got `signal`
// (sent once the first step is printed).
struct Interrupted {
  int code = 0;
  bool timed_out = true;
  double seconds = 0;  // from the signal to the end of the run
  std::string output;
};

Interrupted RunAndSignalWorker(LocalCluster& cluster, int signal, const std::string& name,
                               const std::string& job_file = Runfile("examples/decoder_demo.textproto")) {
  const std::string dir = testing::TempDir(name);
  auto run = testing::StartBackground({Baton(), "run", "--controller=" + cluster.controller_address(), job_file,
                                       "--step_timeout_ms=60000"},
                                      dir + "/run.log");
  const absl::Time start = absl::Now();
  while (!absl::StrContains(testing::ReadFile(dir + "/run.log"), "step    1/") &&
         absl::Now() - start < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const pid_t victim = testing::PidOf(cluster, "worker-1");
  const absl::Time signalled = absl::Now();
  EXPECT_EQ(kill(victim, signal), 0);
  Interrupted r;
  r.code = testing::WaitBackground(run, absl::Seconds(30), &r.timed_out);
  r.seconds = absl::ToDoubleSeconds(absl::Now() - signalled);
  if (signal == SIGSTOP) kill(victim, SIGCONT);
  r.output = testing::ReadFile(dir + "/run.log");
  const size_t tail = r.output.rfind("baton run:");
  std::printf("run ended %.2f s after worker-1 got signal %d, exit %d: %s", r.seconds, signal, r.code,
              r.output.substr(tail == std::string::npos ? 0 : tail).c_str());
  return r;
}

TEST(JobTest, WorkerKilledMidJobFailsTheRunNamingIt) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const Interrupted r = RunAndSignalWorker(*cluster, SIGKILL, "killed");
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(absl::StrContains(r.output, "worker-1")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "rank 1")) << r.output;
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok());
  ASSERT_GT(status->jobs_size(), 0);
  const baton::v1::JobStatus& job = status->jobs(status->jobs_size() - 1);
  EXPECT_EQ(job.state(), baton::v1::JOB_FAILED) << job.DebugString();
  StopAndExpectAllGone(*cluster);
}

// A pipeline stage killed mid-schedule: the ranks waiting on it - its
// neighbours in a receive, the others behind them - are woken by the mesh's
// abort and return within 10 s, each with an error naming the dead stage;
// the fleet then trains a new pipeline on the workers left.
TEST(JobTest, PipelineStageKilledMidScheduleEndsEveryStage) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const std::string dir = testing::TempDir("pp_kill");
  std::string text = testing::ReadFile(Runfile("examples/decoder_pp4_1f1b.textproto"));
  text.replace(text.find("steps: 10"), 9, "steps: 1000");
  const std::string job = dir + "/long_pipeline.textproto";
  std::ofstream(job) << text;
  const Interrupted r = RunAndSignalWorker(*cluster, SIGKILL, "pp_killed", job);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(absl::StrContains(r.output, "worker-1 (rank 1")) << r.output;
  // Every other stage's own outcome: returned, in time, naming rank 1.
  for (int rank : {0, 2, 3}) {
    const std::string label = absl::StrCat("  worker worker-", rank, " (rank ", rank, ", ");
    const size_t at = r.output.find(label);
    ASSERT_NE(at, std::string::npos) << label << " missing in " << r.output;
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    double seconds = 99;
    const size_t after = line.find(" after ");
    ASSERT_NE(after, std::string::npos) << line;
    ASSERT_EQ(std::sscanf(line.c_str() + after, " after %lf s", &seconds), 1) << line;
    std::printf("pp rank %d returned %.2f s into the step: %s\n", rank, seconds, line.c_str());
    EXPECT_LT(seconds, 10.0) << line;
    EXPECT_FALSE(absl::StrContains(line, "cancelled")) << line;
    EXPECT_TRUE(absl::StrContains(line, "rank 1") || absl::StrContains(line, "worker-1")) << line;
  }
  // The fleet is usable: three stages on the three workers left, once the
  // controller has found worker-1 dead (missed heartbeats).
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  bool dead = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(20); !dead && absl::Now() < until;) {
    auto status = (*client)->Status();
    ASSERT_TRUE(status.ok());
    for (const auto& w : status->workers()) dead |= w.name() == "worker-1" && w.state() == baton::v1::DEAD;
    if (!dead) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(dead) << "worker-1 never declared DEAD";
  const std::string three = dir + "/three_stages.textproto";
  std::ofstream(three) << "model { decoder { vocab: 64 dim: 32 layers: 3 heads: 4 ffn_dim: 64 seq_len: 8 } }\n"
                          "mesh { name: \"pp\" size: 3 }\n"
                          "plan { mode: FSDP pipeline_parallel { axis: \"pp\" schedule: ONE_F_ONE_B } }\n"
                          "optimizer { lr: 0.01 }\ndata { synthetic {} batch_size: 6 microbatches: 3 }\nsteps: 2\n";
  auto again = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), three},
                          absl::Seconds(120));
  std::printf("afterwards, 3 stages on the 3 workers left: exit %d\n%s", again.exit_code, again.output.c_str());
  EXPECT_EQ(again.exit_code, 0) << again.output;
  StopAndExpectAllGone(*cluster);
}

// A worker that stops answering without dying (SIGSTOP: a hung host, a
// partitioned pod) is found by its missing heartbeats; the run fails naming
// it instead of waiting for it.
TEST(JobTest, SilentWorkerFailsTheRunWithinTenSeconds) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const Interrupted r = RunAndSignalWorker(*cluster, SIGSTOP, "silent");
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(absl::StrContains(r.output, "worker-1")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "DEAD")) << r.output;
  StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
