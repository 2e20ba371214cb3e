// Sharded checkpoints through the controller, end to end with the SDK
// (baton::Job): save from one plan, load into others bit for bit, exact
// resume on a fresh fleet, and safetensors export against the independent
// PyTorch oracle (faults: tests/checkpoint_faults_test.cc). Real binaries on
// loopback, hard timeouts, nothing left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "checkpoint/safetensors.h"
#include "client/client.h"
#include "client/job.h"
#include "client/local_cluster.h"
#include "common/file_root.h"
#include "strategies/job_spec.h"
#include "tests/checkpoint_fleet.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::CheckpointDecoder;
using testing::CheckpointFleet;
using testing::CheckpointRoot;
using testing::ConnectTo;
using testing::FsdpDecoder;
using testing::Runfile;
using testing::RunCommand;
using testing::StopAndExpectAllGone;


std::vector<double> Losses(const std::vector<baton::v1::StepMetrics>& metrics) {
  std::vector<double> out;
  for (const auto& m : metrics) out.push_back(m.loss());
  return out;
}

// Largest |difference| and number of differing elements between the same
// tensors of two checkpoints, by kind (param, exp_avg, exp_avg_sq).
struct Diff {
  double max_abs[3] = {0, 0, 0};
  int64_t differing[3] = {0, 0, 0};
  int tensors = 0;
};

Diff Compare(const std::string& a_dir, const std::string& b_dir) {
  Diff d;
  auto a = ReadMetadata(a_dir), b = ReadMetadata(b_dir);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(b.ok()) << b.status();
  if (!a.ok() || !b.ok()) return d;
  EXPECT_EQ(a->tensors_size(), b->tensors_size());
  for (const auto& ta : a->tensors()) {
    const baton::v1::CheckpointTensor* tb = nullptr;
    for (const auto& t : b->tensors()) {
      if (t.name() == ta.name()) tb = &t;
    }
    EXPECT_NE(tb, nullptr) << ta.name();
    if (tb == nullptr) continue;
    auto va = ReadTensor(a_dir, *a, ta), vb = ReadTensor(b_dir, *b, *tb);
    EXPECT_TRUE(va.ok() && vb.ok()) << ta.name();
    if (!va.ok() || !vb.ok()) continue;
    const int kind = absl::EndsWith(ta.name(), ".exp_avg") ? 1 : absl::EndsWith(ta.name(), ".exp_avg_sq") ? 2 : 0;
    ++d.tensors;
    for (size_t i = 0; i < va->size(); ++i) {
      const double diff = std::abs(static_cast<double>((*va)[i]) - (*vb)[i]);
      d.max_abs[kind] = std::max(d.max_abs[kind], diff);
      d.differing[kind] += std::memcmp(&(*va)[i], &(*vb)[i], 4) != 0;
    }
  }
  return d;
}

// Step 3 of FSDP on 2 workers, saved; loaded into each other plan and saved
// again from there at once: every tensor identical bit for bit.
TEST(CheckpointTest, SavedFsdpLoadsBitIdenticallyIntoEveryPlan) {
  auto fleet = CheckpointFleet(4);
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  auto job = Job::Create(client.get(), FsdpDecoder(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(3).ok());
  auto saved = (*job)->Save("reshard/fsdp2");
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE((*job)->Stop().ok());
  const std::vector<std::pair<std::string, baton::v1::JobSpec>> targets = {
      {"fsdp1", FsdpDecoder(1)},
      {"fsdp4", FsdpDecoder(4)},
      {"ddp2", CheckpointDecoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: DDP")},
      {"zero1_4", CheckpointDecoder(R"pb(mesh { name: "dp" size: 4 })pb", "mode: ZERO1")},
      {"dp2_tp2", CheckpointDecoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
                          R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb")},
      {"pp2", CheckpointDecoder(R"pb(mesh { name: "pp" size: 2 })pb",
                      R"pb(mode: FSDP pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B })pb")},
  };
  for (const auto& [name, spec] : targets) {
    auto restored = Job::Restore(client.get(), spec, "reshard/fsdp2");
    ASSERT_TRUE(restored.ok()) << name << ": " << restored.status();
    EXPECT_EQ((*restored)->step(), 3);
    auto again = (*restored)->Save("reshard/" + name);
    ASSERT_TRUE(again.ok()) << name << ": " << again.status();
    ASSERT_TRUE((*restored)->Stop().ok());
    const Diff d = Compare(saved->path(), again->path());
    std::printf("FSDP dp=2 -> %-8s %d tensors, max |diff| param %g exp_avg %g exp_avg_sq %g; elements differing %lld "
                "(read %lld bytes in %.3f s)\n",
                name.c_str(), d.tensors, d.max_abs[0], d.max_abs[1], d.max_abs[2],
                static_cast<long long>(d.differing[0] + d.differing[1] + d.differing[2]),
                static_cast<long long>((*restored)->created().restored().bytes()),
                (*restored)->created().restored().seconds());
    EXPECT_EQ(d.tensors, 3 * 19);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(d.differing[k], 0) << name << " kind " << k;
  }
  StopAndExpectAllGone(*fleet);
}

// 10 uninterrupted steps against a save at step 5 resumed on a fresh fleet:
// bit-identical on the same plan; within 1e-5 on 4 workers and on FSDP x TP.
TEST(CheckpointTest, ExactResumeOnAFreshFleet) {
  std::vector<double> full;
  {
    auto fleet = CheckpointFleet(4);
    ASSERT_NE(fleet, nullptr);
    auto client = ConnectTo(*fleet);
    auto job = Job::Create(client.get(), FsdpDecoder(2));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE((*job)->Step(5).ok());
    ASSERT_TRUE((*job)->Save("resume").ok());
    ASSERT_TRUE((*job)->Step(5).ok());
    full = Losses((*job)->metrics());
    ASSERT_EQ(full.size(), 10u);
    StopAndExpectAllGone(*fleet);
  }
  auto fleet = CheckpointFleet(4);
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  const std::vector<std::tuple<std::string, baton::v1::JobSpec, double>> layouts = {
      {"same plan (FSDP dp=2)", FsdpDecoder(2), 0.0},
      {"FSDP dp=4", FsdpDecoder(4), 1e-5},
      {"FSDP dp=2 x TP tp=2", CheckpointDecoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
                                      R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb"),
       1e-5},
  };
  for (const auto& [name, spec, tolerance] : layouts) {
    auto job = Job::Restore(client.get(), spec, "resume");  // the newest step-N under it
    ASSERT_TRUE(job.ok()) << name << ": " << job.status();
    ASSERT_EQ((*job)->step(), 5);
    auto metrics = (*job)->Step(10);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    ASSERT_EQ(metrics->size(), 5u);
    double worst = 0;
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ((*metrics)[i].step(), static_cast<int>(6 + i));
      worst = std::max(worst, std::abs((*metrics)[i].loss() - full[5 + i]) / std::abs(full[5 + i]));
    }
    std::printf("resumed at step 5 onto %-22s steps 6-10 worst relative loss difference %.3g (allowed %g)\n",
                name.c_str(), worst, tolerance);
    EXPECT_LE(worst, tolerance) << name;
    ASSERT_TRUE((*job)->Stop().ok());
  }
  StopAndExpectAllGone(*fleet);
}

std::string PythonJson(const std::vector<std::string>& argv) {
  auto r = RunCommand(argv, absl::Seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}


// Export against an independent reader (stdlib + torch.frombuffer) and the
// PyTorch oracle, and init_from -> save -> export round trips exactly.
TEST(CheckpointTest, ExportedWeightsMatchTheOracle) {
  const std::string python = testing::TorchPython();
  ASSERT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing: ./dev.sh makes the Python environment";
  auto fleet = CheckpointFleet(4);
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  const baton::v1::JobSpec spec = FsdpDecoder(2);
  // The job file the oracle reads: the same spec, as text.
  const std::string job_file = CheckpointRoot() + "/export_job.textproto";
  {
    std::FILE* f = std::fopen(job_file.c_str(), "w");
    std::fputs(spec.DebugString().c_str(), f);
    std::fclose(f);
  }
  auto job = Job::Create(client.get(), spec);
  ASSERT_TRUE(job.ok()) << job.status();
  auto at0 = (*job)->Save("export");
  ASSERT_TRUE(at0.ok()) << at0.status();
  ASSERT_TRUE((*job)->Step(4).ok());
  auto at4 = (*job)->Save("export");
  ASSERT_TRUE(at4.ok());
  auto step5 = (*job)->Step(1);
  ASSERT_TRUE(step5.ok());
  ASSERT_TRUE((*job)->Stop().ok());
  const std::string init_out = CheckpointRoot() + "/export/init.safetensors", w4 = CheckpointRoot() + "/export/step4.safetensors";
  for (const auto& [dir, out] : {std::pair{at0->path(), init_out}, std::pair{at4->path(), w4}}) {
    auto r = RunCommand({testing::BatonBinary(), "checkpoint", "export", dir, out}, absl::Seconds(60));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string oracle = Runfile("tests/oracle/oracle.py");
  const std::string init = PythonJson({python, oracle, "--init-diff", init_out, job_file});
  std::printf("exported initial weights vs the oracle's: %s", init.c_str());
  EXPECT_EQ(testing::Field(init, "mismatched"), 0);
  EXPECT_EQ(testing::Field(init, "max_abs_diff"), 0);
  const std::string next = PythonJson({python, oracle, "--next-loss", w4, "--step", "4", job_file});
  const double oracle_loss = testing::Field(next, "loss"), baton_loss = (*step5)[0].loss();
  const double rel = std::abs(oracle_loss - baton_loss) / std::abs(baton_loss);
  std::printf("step 5 loss from the exported step-4 weights: oracle %.8f, Baton %.8f, relative difference %.3g\n",
              oracle_loss, baton_loss, rel);
  EXPECT_LE(rel, 1e-5);

  // init_from the export onto FSDP x TP, saved at once and exported again.
  baton::v1::JobSpec tp = CheckpointDecoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
                                  R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb");
  tp.set_init_from("export/step4.safetensors");
  auto from = Job::Create(client.get(), tp);
  ASSERT_TRUE(from.ok()) << from.status();
  auto resaved = (*from)->Save("export/roundtrip");
  ASSERT_TRUE(resaved.ok());
  const std::string again = CheckpointRoot() + "/export/roundtrip.safetensors";
  ASSERT_EQ(RunCommand({testing::BatonBinary(), "checkpoint", "export", resaved->path(), again}, absl::Seconds(60))
                .exit_code,
            0);
  auto a = ReadSafetensors(w4), b = ReadSafetensors(again);
  ASSERT_TRUE(a.ok() && b.ok());
  int64_t differing = 0;
  ASSERT_EQ(a->tensors_size(), b->tensors_size());
  for (int i = 0; i < a->tensors_size(); ++i) {
    auto va = ReadTensor(CheckpointRoot() + "/export", *a, a->tensors(i)), vb = ReadTensor(CheckpointRoot() + "/export", *b, b->tensors(i));
    ASSERT_TRUE(va.ok() && vb.ok());
    differing += std::memcmp(va->data(), vb->data(), va->size() * 4) != 0;
  }
  std::printf("export -> init_from (dp=2 x tp=2) -> save -> export: %d tensors, %lld differ\n", a->tensors_size(),
              static_cast<long long>(differing));
  EXPECT_EQ(differing, 0);
  StopAndExpectAllGone(*fleet);
}

}  // namespace
}  // namespace baton
