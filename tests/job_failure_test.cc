// Failures of an attached job through real daemons: a worker killed mid-job,
// a pipeline stage killed mid-schedule, a silent worker - each ends the run
// naming the worker, at once, and leaves nothing behind; a worker runs
// step calls sent ahead in turn. (The rest of
// JobTest is in job_test.cc.)
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

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

// The state a worker keeps past its mesh, asked for wrongly: a job it does
// not keep, another step, a box outside its piece, an absurd wait - each a
// clear error; a good box answers its bytes, and the fleet trains after.
// A 2-worker fleet's dp=2 mesh, formed through the controller, and the
// decoder example's Programs for job `job_id`: for tests that call the
// mesh's workers themselves.
struct DirectMesh {
  std::unique_ptr<LocalCluster> cluster;
  baton::v1::Mesh mesh;
  std::vector<baton::v1::Program> programs;
};
constexpr char kDirectJobFile[] = "examples/decoder_fsdp2.textproto";

void FormDirectMesh(const std::string& job_id, DirectMesh* out) {
  out->cluster = StartCluster(2);
  ASSERT_NE(out->cluster, nullptr);
  auto client = Client::Connect(out->cluster->controller_address());
  ASSERT_TRUE(client.ok());
  auto mesh = (*client)->CreateMesh("dp=2");
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  out->mesh = *mesh;
  auto job = ParseJobSpec(testing::ReadFile(Runfile(kDirectJobFile)), false);
  ASSERT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, job_id);
  ASSERT_TRUE(programs.ok());
  out->programs = *programs;
}

TEST(JobTest, KeptStateAnswersBadReadsWithClearErrors) {
  DirectMesh direct;
  ASSERT_NO_FATAL_FAILURE(FormDirectMesh("kept", &direct));
  LocalCluster* const cluster = direct.cluster.get();
  const baton::v1::Mesh* const mesh = &direct.mesh;
  const std::vector<baton::v1::Program>* const programs = &direct.programs;
  const std::string file = Runfile(kDirectJobFile);
  auto worker = baton::v1::Worker::NewStub(testing::FleetChannel(*cluster, mesh->worker_addresses(0)));
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    return ((*worker).*method)(&ctx, req, resp);
  };
  baton::v1::LoadProgramRequest load;
  load.set_epoch(mesh->epoch());
  *load.mutable_program() = (*programs)[0];
  baton::v1::LoadProgramResponse loaded;
  ASSERT_TRUE(call(&baton::v1::Worker::Stub::LoadProgram, load, &loaded).ok());
  // Its mesh aborted, the worker keeps the job at step 0.
  baton::v1::AbortRequest abort;
  abort.set_epoch(mesh->epoch());
  baton::v1::AbortResponse aborted;
  ASSERT_TRUE(call(&baton::v1::Worker::Stub::Abort, abort, &aborted).ok());
  baton::v1::GetRetainedRequest ask;
  ask.set_job_id("kept");
  ask.set_wait_ms(5000);
  baton::v1::GetRetainedResponse kept;
  ASSERT_TRUE(call(&baton::v1::Worker::Stub::GetRetained, ask, &kept).ok());
  std::printf("kept after its mesh was aborted: held %d, step %d, %lld bytes\n", kept.held(), kept.step(),
              static_cast<long long>(kept.bytes()));
  EXPECT_TRUE(kept.held());
  EXPECT_EQ(kept.step(), 0);
  EXPECT_GT(kept.bytes(), 0);
  ask.set_wait_ms(-1);
  EXPECT_EQ(call(&baton::v1::Worker::Stub::GetRetained, ask, &kept).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const baton::v1::ParamLayout& param = (*programs)[0].units(0).params(0);
  auto read = [&](const std::string& job_id, int step, std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                  baton::v1::ReadPiecesResponse* resp) {
    baton::v1::ReadPiecesRequest req;
    req.set_job_id(job_id);
    req.set_step(step);
    auto* box = req.add_boxes();
    box->set_param(param.name());
    box->mutable_offsets()->Assign(offsets.begin(), offsets.end());
    box->mutable_sizes()->Assign(sizes.begin(), sizes.end());
    return call(&baton::v1::Worker::Stub::ReadPieces, req, resp);
  };
  const int64_t rows = param.shape(0), cols = param.shape(1);
  baton::v1::ReadPiecesResponse got;
  const grpc::Status good = read("kept", 0, {0, 0}, {1, cols}, &got);
  ASSERT_TRUE(good.ok()) << good.error_message();
  ASSERT_EQ(got.values_size(), 1);
  EXPECT_EQ(static_cast<int64_t>(got.values(0).size()), cols * 4);
  struct Case {
    std::string what;
    grpc::Status status;
    grpc::StatusCode expect;
  } cases[] = {
      {"a job it does not keep", read("other", 0, {0, 0}, {1, cols}, &got), grpc::StatusCode::NOT_FOUND},
      {"another step", read("kept", 3, {0, 0}, {1, cols}, &got), grpc::StatusCode::FAILED_PRECONDITION},
      {"rows of rank 1's piece", read("kept", 0, {rows - 1, 0}, {1, cols}, &got), grpc::StatusCode::INVALID_ARGUMENT},
      {"a 2^62-element box", read("kept", 0, {0, 0}, {int64_t{1} << 31, int64_t{1} << 31}, &got),
       grpc::StatusCode::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    std::printf("%s: %s\n", c.what.c_str(), c.status.error_message().c_str());
    EXPECT_EQ(c.status.error_code(), c.expect) << c.what << ": " << c.status.error_message();
  }
  {
    // Its whole piece asked for until the answer would pass 1 GiB.
    baton::v1::ReadPiecesRequest req;
    req.set_job_id("kept");
    const int64_t piece_bytes = rows / 2 * cols * 4;
    for (int64_t b = 0; b <= (int64_t{1} << 30) / piece_bytes; ++b) {
      auto* box = req.add_boxes();
      box->set_param(param.name());
      box->add_offsets(0);
      box->add_offsets(0);
      box->add_sizes(rows / 2);
      box->add_sizes(cols);
    }
    const grpc::Status s = call(&baton::v1::Worker::Stub::ReadPieces, req, &got);
    std::printf("%d boxes of %lld bytes: %s\n", req.boxes_size(), static_cast<long long>(piece_bytes),
                s.error_message().c_str());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  baton::v1::ReleaseStateRequest release;
  release.set_job_id("kept");
  baton::v1::ReleaseStateResponse released;
  ASSERT_TRUE(call(&baton::v1::Worker::Stub::ReleaseState, release, &released).ok());
  EXPECT_EQ(released.bytes(), kept.bytes());
  auto again = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), file}, absl::Seconds(120));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  StopAndExpectAllGone(*cluster);
}

// The controller sends a step call while the one before it runs: a worker
// holds a call for a later step until the step before it has run there,
// refuses one that is not next (stale or foreign) without harm to the job,
// and runs calls that arrive out of order in step order.
TEST(JobTest, AWorkerRunsStepCallsInTurn) {
  DirectMesh direct;
  ASSERT_NO_FATAL_FAILURE(FormDirectMesh("turns", &direct));
  std::vector<std::unique_ptr<baton::v1::Worker::Stub>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(
        baton::v1::Worker::NewStub(testing::FleetChannel(*direct.cluster, direct.mesh.worker_addresses(r))));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    baton::v1::LoadProgramRequest load;
    load.set_epoch(direct.mesh.epoch());
    *load.mutable_program() = direct.programs[r];
    baton::v1::LoadProgramResponse loaded;
    ASSERT_TRUE(workers[r]->LoadProgram(&ctx, load, &loaded).ok());
  }
  auto run_step = [&](int rank, int step, absl::Duration deadline, baton::v1::RunStepResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    baton::v1::RunStepRequest req;
    req.set_epoch(direct.mesh.epoch());
    req.set_job_id("turns");
    req.set_step(step);
    req.set_timeout_ms(30000);
    return workers[rank]->RunStep(&ctx, req, resp);
  };
  baton::v1::RunStepResponse resp;
  // Step 3 of a job at step 0 waits for steps 1 and 2 (until its deadline).
  absl::Time start = absl::Now();
  const grpc::Status early = run_step(0, 3, absl::Milliseconds(700), &resp);
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  // Step 0 is not next: refused at once.
  const grpc::Status stale = run_step(0, 0, absl::Seconds(5), &resp);
  std::printf("step 3 at step 0: %s after %.2f s; step 0: %s\n", early.error_message().c_str(), waited,
              stale.error_message().c_str());
  EXPECT_EQ(early.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << early.error_message();
  EXPECT_GE(waited, 0.6);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << stale.error_message();
  // Step 2 sent on both ranks before step 1: each runs after step 1.
  grpc::Status second[2], first[2];
  baton::v1::RunStepResponse second_resp[2], first_resp[2];
  absl::Time second_done[2];
  std::vector<std::thread> calls;
  for (int r = 0; r < 2; ++r) {
    calls.emplace_back([&, r] {
      second[r] = run_step(r, 2, absl::Seconds(60), &second_resp[r]);
      second_done[r] = absl::Now();
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time first_sent = absl::Now();
  for (int r = 0; r < 2; ++r) {
    calls.emplace_back([&, r] {
      first[r] = run_step(r, 1, absl::Seconds(60), &first_resp[r]);
    });
  }
  for (auto& t : calls) t.join();
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d: step 1 %s (metrics of step %lld), step 2 %s (metrics of step %lld), %s\n", r,
                first[r].ok() ? "OK" : first[r].error_message().c_str(),
                first_resp[r].metrics_size() ? static_cast<long long>(first_resp[r].metrics(0).step()) : -1LL,
                second[r].ok() ? "OK" : second[r].error_message().c_str(),
                second_resp[r].metrics_size() ? static_cast<long long>(second_resp[r].metrics(0).step()) : -1LL,
                second_done[r] >= first_sent ? "step 2 answered after step 1 was sent" : "step 2 ran ALONE");
    ASSERT_TRUE(first[r].ok()) << first[r].error_message();
    ASSERT_TRUE(second[r].ok()) << second[r].error_message();
    EXPECT_EQ(first_resp[r].metrics(0).step(), 1);
    EXPECT_EQ(second_resp[r].metrics(0).step(), 2);
    // Which answer reaches its thread first is the scheduler's business;
    // that step 2 waited for step 1 to arrive is the worker's.
    EXPECT_GE(second_done[r], first_sent);
  }
  // Both ranks computed the same loss for each step (their collectives met).
  EXPECT_EQ(first_resp[0].metrics(0).loss(), first_resp[1].metrics(0).loss());
  EXPECT_EQ(second_resp[0].metrics(0).loss(), second_resp[1].metrics(0).loss());
  StopAndExpectAllGone(*direct.cluster);
}

}  // namespace
}  // namespace baton
