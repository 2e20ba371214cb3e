// Training through the controller, end to end: `baton run` on a local fleet
// against `baton reference` in one process, bad job files, and a worker
// killed mid-job. Real binaries on loopback, hard timeouts, nothing left
// behind.
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

// Two runs' step lines (`baton run --output=json`) agree bit for bit on
// what the run computed (step, loss, gradient norm, bytes, tokens).
void ExpectSameSteps(const std::vector<std::string>& a, const std::vector<std::string>& b, const std::string& how) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool equal = true;
    for (const char* key : {"step", "loss", "grad_norm", "comm_bytes", "tokens"}) {
      equal &= Field(a[i], key) == Field(b[i], key);
    }
    same += equal;
    EXPECT_TRUE(equal) << a[i] << "\n" << b[i];
  }
  std::printf("%d of %zu steps identical (step, loss, grad norm, bytes, tokens) %s\n", same, a.size(), how.c_str());
}

TEST(JobTest, RunThroughTheControllerMatchesTheReference) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  for (const char* example : {"decoder_fsdp2.textproto", "decoder_fsdp4.textproto", "decoder_zero1.textproto",
                              "decoder_zero2.textproto", "decoder_ddp.textproto", "decoder_hsdp.textproto",
                              "mlp_seed_lab.textproto", "decoder_zero2.json", "decoder_tp2.textproto",
                              "decoder_tp4_sp_lp.textproto", "decoder_fsdp_tp.textproto", "decoder_pp4_gpipe.textproto",
                              "decoder_pp4_1f1b.textproto", "decoder_pp4_interleaved.textproto",
                              "decoder_pp2_fsdp2.textproto", "decoder_pp2_tp2.textproto",
                              "llama_gqa_tp2.textproto", "llama_gqa_pp2.textproto", "llama_parallel_tp2.textproto",
                              "llama_cp2.textproto", "llama_cp4.textproto", "llama_dp2_cp2.textproto",
                              "llama_cp2_tp2.textproto", "llama_pp2_cp2.textproto"}) {
    const std::string file = Runfile(absl::StrCat("examples/", example));
    // The dry run's predictions, made without any worker.
    auto plan = RunCommand({Baton(), "plan", file, "--output=json"}, absl::Seconds(60));
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    const std::vector<std::string> plan_lines = JsonLines(plan.output, "{\"plan\":");
    ASSERT_EQ(plan_lines.size(), 1u) << plan.output;
    auto run = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), file,
                           "--output=json"},
                          absl::Seconds(120));
    auto ref = RunCommand({Baton(), "reference", file, "--output=json"}, absl::Seconds(120));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    auto run_lines = JsonLines(run.output), ref_lines = JsonLines(ref.output);
    ASSERT_FALSE(run_lines.empty());
    ASSERT_EQ(run_lines.size(), ref_lines.size());
    // Every step's per-rank figures are exactly what the plan predicts.
    const testing::TheoryLine theory = testing::ParseTheory(run.output);
    ASSERT_TRUE(theory.found) << run.output;
    double worst = 0, exposed = 0, in_flight = 0;
    for (size_t i = 0; i < run_lines.size(); ++i) {
      for (const char* key : {"step", "loss", "tokens_per_s", "step_ms", "comm_bytes", "state_bytes",
                              "peak_unsharded_param_bytes", "grad_norm", "tokens", "comm_wait_ms", "comm_ms", "compute_ms"}) {
        EXPECT_FALSE(std::isnan(Field(run_lines[i], key))) << key << " missing in " << run_lines[i];
      }
      EXPECT_EQ(Field(run_lines[i], "comm_bytes"), theory.comm) << run_lines[i];
      EXPECT_EQ(Field(run_lines[i], "state_bytes"), theory.state) << run_lines[i];
      EXPECT_EQ(Field(run_lines[i], "peak_unsharded_param_bytes"), theory.peak) << run_lines[i];
      EXPECT_EQ(Field(run_lines[i], "tokens"), Field(ref_lines[i], "tokens")) << "tokens counted once";
      const double a = Field(run_lines[i], "loss"), b = Field(ref_lines[i], "loss");
      worst = std::max(worst, std::abs(a - b) / std::abs(b));
      // Exposed communication: what the computing thread waited on is part
      // of what was in flight (the largest rank's of each, which may be two
      // ranks: a thousandth of slack for the rounding of the figures).
      const double waited = Field(run_lines[i], "comm_wait_ms"), flight = Field(run_lines[i], "comm_ms");
      EXPECT_LE(waited, flight + 0.001) << run_lines[i];
      exposed += waited;
      in_flight += flight;
    }
    std::printf("%s: %zu steps through the controller, loss %.6f -> %.6f, worst relative difference "
                "from the reference %.3g; comm %lld B/step, state %lld B, peak unsharded %lld B per rank, "
                "each equal to the plan's theory\n",
                example, run_lines.size(), Field(run_lines.front(), "loss"), Field(run_lines.back(), "loss"),
                worst, (long long)theory.comm, (long long)theory.state, (long long)theory.peak);
    EXPECT_LE(worst, 1e-5);
    std::printf("%s: exposed communication %.1f ms of %.1f ms in flight over %zu steps (largest rank per step)\n",
                example, exposed, in_flight, run_lines.size());
    // FSDP prefetches the next unit's gather while this one computes: part
    // of its communication is hidden.
    if (std::string(example) == "decoder_fsdp2.textproto") {
      EXPECT_LT(exposed, in_flight) << example;
    }
    // `baton plan` against what the run measured (largest rank): state and
    // live microbatches exact, comm within 2 % (the bound; the plan
    // prices the same Programs the workers ran, so it is exact here).
    const std::string& last = run_lines.back();
    const double plan_comm = Field(plan_lines[0], "comm_bytes");
    std::printf("%s: baton plan predicted state %.0f B, comm %.0f B/step, %.0f live microbatches (%.0f B); the run "
                "measured %.0f B, %.0f B/step (ratio %.4f), %.0f (%.0f B)\n",
                example, Field(plan_lines[0], "state_bytes"), plan_comm, Field(plan_lines[0], "peak_live_microbatches"),
                Field(plan_lines[0], "peak_live_activation_bytes"), Field(last, "state_bytes"),
                Field(last, "comm_bytes"), Field(last, "comm_bytes") / plan_comm,
                Field(last, "peak_live_microbatches"), Field(last, "peak_live_activation_bytes"));
    EXPECT_EQ(Field(last, "state_bytes"), Field(plan_lines[0], "state_bytes")) << example;
    EXPECT_NEAR(Field(last, "comm_bytes") / plan_comm, 1.0, 0.02) << example;
    EXPECT_EQ(Field(last, "peak_live_microbatches"), Field(plan_lines[0], "peak_live_microbatches")) << example;
    // And `baton run` closes with the same comparison.
    const std::vector<std::string> closing = JsonLines(run.output, "{\"measured_vs_predicted\":");
    ASSERT_EQ(closing.size(), 1u) << run.output;
  }
  StopAndExpectAllGone(*cluster);
}

// K steps per call: the workers run K steps per round trip; every step's
// loss, gradient norm and bytes are the one-step-per-call run's, bit for bit.
TEST(JobTest, KStepsPerCallGiveTheSameStepsBitForBit) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  for (const char* example : {"decoder_fsdp2.textproto", "decoder_pp4_1f1b.textproto"}) {
    const std::string file = Runfile(absl::StrCat("examples/", example));
    std::vector<std::vector<std::string>> lines;
    for (const char* k : {"--steps_per_call=1", "--steps_per_call=4"}) {
      auto run = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), file, "--output=json", k},
                            absl::Seconds(120));
      ASSERT_EQ(run.exit_code, 0) << run.output;
      lines.push_back(JsonLines(run.output));
    }
    ExpectSameSteps(lines[0], lines[1], absl::StrCat(example, ", with 4 steps per call"));
  }
  StopAndExpectAllGone(*cluster);
}

// The step channel (the workers' default without TLS) and gRPC RunStep
// carry the same steps: a fleet whose workers refuse the channel trains the
// same job bit for bit, and only the channel fleet's meshes say they use it.
TEST(JobTest, StepChannelAndGrpcStepsAreTheSameStepsBitForBit) {
  const std::string file = Runfile("examples/decoder_fsdp2.textproto");
  std::vector<std::vector<std::string>> lines;
  for (const bool channel : {true, false}) {
    auto cluster = channel ? StartCluster(4) : StartCluster(4, {}, {"--step_channel=false"});
    ASSERT_NE(cluster, nullptr);
    auto run = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), file, "--output=json",
                           "--steps_per_call=1"},
                          absl::Seconds(120));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    lines.push_back(JsonLines(run.output));
    auto watch = RunCommand({Baton(), "watch", "--controller=" + cluster->controller_address(), "--seconds=1"},
                            absl::Seconds(20));
    ASSERT_EQ(watch.exit_code, 0) << watch.output;
    int created = 0, over_channel = 0;
    for (absl::string_view line : absl::StrSplit(watch.output, '\n')) {
      if (!absl::StrContains(line, "MESH_CREATED")) continue;
      ++created;
      over_channel += absl::StrContains(line, "steps over step channels");
    }
    std::printf("%s: %d of %d meshes created say \"steps over step channels\"\n",
                channel ? "default workers" : "--step_channel=false", over_channel, created);
    EXPECT_GT(created, 0) << watch.output;
    EXPECT_EQ(over_channel, channel ? created : 0) << watch.output;
    StopAndExpectAllGone(*cluster);
  }
  ExpectSameSteps(lines[0], lines[1], "over the step channel and over gRPC");
}

TEST(JobTest, BadJobFilesFailBeforeAnyWorkerIsTouched) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::string dir = testing::TempDir("jobs");
  const std::string good = testing::ReadFile(Runfile("examples/decoder_fsdp2.textproto"));
  auto variant = [&](const std::string& name, const std::string& from, const std::string& to) {
    std::string text = good;
    auto pos = text.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    text.replace(pos, from.size(), to);
    const std::string path = dir + "/" + name + ".textproto";
    std::ofstream(path) << text;
    return path;
  };
  // Two pipeline stages of a decoder with `layers` blocks.
  auto pipeline = [&](const std::string& name, int layers, const std::string& pipeline_parallel, int microbatches) {
    const std::string path = dir + "/" + name + ".textproto";
    std::ofstream(path) << "model { decoder { vocab: 64 dim: 32 layers: " << layers
                        << " heads: 4 ffn_dim: 64 seq_len: 8 } }\n"
                        << "mesh { name: \"pp\" size: 2 }\n"
                        << "plan { mode: FSDP pipeline_parallel { axis: \"pp\" " << pipeline_parallel << " } }\n"
                        << "optimizer { lr: 0.01 }\ndata { synthetic {} batch_size: 16 microbatches: " << microbatches
                        << " }\nsteps: 1\n";
    return path;
  };
  struct Bad {
    std::string path, expect;
    bool plannable = false;  // a fleet too small: the dry run needs no worker
  } cases[] = {
      {pipeline("pp_more_stages_than_blocks", 1, "schedule: GPIPE", 2), "more stages than blocks"},
      {pipeline("pp_more_chunks_than_blocks", 3, "schedule: INTERLEAVED_1F1B virtual_stages: 2", 2),
       "more stages than blocks: 2 ranks x 2 chunks = 4 chunks for 3 blocks"},
      {pipeline("pp_no_microbatch", 2, "schedule: ONE_F_ONE_B", 0), "data.microbatches must be >= 1, got 0"},
      {pipeline("pp_interleaved_m3", 4, "schedule: INTERLEAVED_1F1B", 1),
       "INTERLEAVED_1F1B needs data.microbatches (1) to be a multiple of the 2 pipeline ranks"},
      {pipeline("pp_empty_stage", 3, "schedule: GPIPE split: 3 split: 0", 2), "split leaves chunk 1 without a block"},
      {pipeline("pp_split_sum", 3, "schedule: GPIPE split: 1 split: 1", 2), "summing to the model's 3"},
      {pipeline("pp_axis", 2, "schedule: GPIPE } tensor_parallel { axis: \"pp\"", 2),
       "axis \"pp\" is also the tensor-parallel axis"},
      {variant("unknown_field", "seq_len: 32", "seq_len: 32 dropout: 0.1"), "no field named \"dropout\""},
      {variant("too_big", "size: 2", "size: 8"), "needs 8 workers", true},
      {variant("heads", "heads: 4", "heads: 3"), "not divisible by heads 3"},
      {variant("negative_lr", "lr: 0.003", "lr: -0.003"), "optimizer.lr must be positive"},
      {variant("tp_style", "plan { mode: FSDP }",
               "plan { mode: FSDP tensor_parallel { axis: \"dp\" "
               "styles { module: \"layers.*.attn.wq\" style: COLWISE } } }"),
       "\"layers.*.attn.wq\" matches no module"},
      {variant("tp_rowwise_first", "plan { mode: FSDP }",
               "plan { mode: FSDP tensor_parallel { axis: \"dp\" "
               "styles { module: \"layers.*.feed_forward.w1\" style: ROWWISE } } }"),
       "would put the sum inside the nonlinearity"},
  };
  for (const Bad& c : cases) {
    auto run = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), c.path},
                          absl::Seconds(30));
    std::printf("%s -> exit %d: %s", c.path.c_str(), run.exit_code, run.output.c_str());
    EXPECT_NE(run.exit_code, 0);
    EXPECT_TRUE(absl::StrContains(run.output, c.expect)) << run.output;
    // The dry run refuses it the same way, as bad usage.
    if (c.plannable) continue;
    auto plan = RunCommand({Baton(), "plan", c.path}, absl::Seconds(30));
    EXPECT_EQ(plan.exit_code, 2) << plan.output;
    EXPECT_TRUE(absl::StrContains(plan.output, c.expect)) << plan.output;
  }
  // 1F1B on NCCL: its sends would block the stream in a circle; refused.
  auto nccl = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), "--backend=nccl",
                          pipeline("pp_nccl_1f1b", 2, "schedule: ONE_F_ONE_B", 2)},
                         absl::Seconds(30));
  std::printf("1F1B on NCCL -> exit %d: %s", nccl.exit_code, nccl.output.c_str());
  EXPECT_NE(nccl.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(nccl.output, "ONE_F_ONE_B is not supported on NCCL yet")) << nccl.output;
  // No worker was touched: no mesh formed, no job created, all still REGISTERED.
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->meshes_size(), 0);
  EXPECT_EQ(status->jobs_size(), 0);
  for (const auto& w : status->workers()) EXPECT_EQ(w.state(), baton::v1::REGISTERED) << w.name();
  StopAndExpectAllGone(*cluster);
}

// Programs no planner would write, sent straight to a worker's LoadProgram:
// each is refused with INVALID_ARGUMENT naming the problem, and the fleet
// trains again afterwards.
TEST(JobTest, HostileProgramsAreRefusedAndTheWorkerKeepsServing) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::string file = Runfile("examples/decoder_fsdp2.textproto");
  auto first = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), file}, absl::Seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  // A job's mesh goes with it: the Programs go to a mesh formed for them.
  auto mesh = (*client)->CreateMesh("dp=2");
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto job = ParseJobSpec(testing::ReadFile(file), false);
  ASSERT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, "hostile");
  ASSERT_TRUE(programs.ok());
  const baton::v1::Program good = (*programs)[0];
  auto worker = baton::v1::Worker::NewStub(testing::FleetChannel(*cluster, mesh->worker_addresses(0)));
  struct Case {
    std::string what, expect;
    std::function<void(baton::v1::Program*)> mutate;
  } cases[] = {
      {"a 2^40-element parameter", "has a dimension of 1099511627776",
       [](baton::v1::Program* p) { p->mutable_units(1)->mutable_params(1)->set_shape(0, int64_t{1} << 40); }},
      {"a peer outside the mesh", "peer 9 is not another rank",
       [](baton::v1::Program* p) {
         auto* i = p->add_instructions();
         i->set_op(baton::v1::Instruction::SEND_ACTIVATION);
         i->set_stage(1);
         i->add_axes("dp");
         i->set_peer(9);
       }},
      {"a unit it does not own", "does not own",
       [](baton::v1::Program* p) { p->mutable_units()->RemoveLast(); }},
      {"Shard(5) of a matrix", "Shard(5) is out of range",
       [](baton::v1::Program* p) { p->mutable_units(1)->mutable_params(1)->mutable_placements(0)->set_dim(5); }},
      {"rows beyond the batch", "not within the global batch",
       [](baton::v1::Program* p) {
         for (auto& i : *p->mutable_instructions()) i.set_rows(i.rows() * 100);
       }},
  };
  for (const Case& c : cases) {
    baton::v1::LoadProgramRequest req;
    req.set_epoch(mesh->epoch());
    *req.mutable_program() = good;
    c.mutate(req.mutable_program());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    baton::v1::LoadProgramResponse resp;
    const grpc::Status s = worker->LoadProgram(&ctx, req, &resp);
    std::printf("%s: %s\n", c.what.c_str(), s.error_message().c_str());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_TRUE(absl::StrContains(s.error_message(), c.expect)) << s.error_message();
  }
  auto again = RunCommand({Baton(), "run", "--controller=" + cluster->controller_address(), file}, absl::Seconds(120));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
