// Sharded checkpoints through the controller, end to end with the SDK
// (baton::Job): save from one plan, load into others bit for bit, exact
// resume on a fresh fleet, atomicity under SIGKILL, corruption, async saves,
// safetensors export against the independent PyTorch oracle, and bad input.
// Real binaries on loopback, hard timeouts, nothing left behind.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <random>

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
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::Runfile;
using testing::RunCommand;
using testing::StartCluster;
using testing::StopAndExpectAllGone;

constexpr char kPython[] = "/usr/bin/python3";

std::string Root() {
  static const std::string root = [] {
    const std::string r = absl::StrCat(std::getenv("TEST_TMPDIR"), "/root");
    EXPECT_TRUE(MakeDirs(r).ok());
    return r;
  }();
  return root;
}

std::unique_ptr<LocalCluster> Fleet(int workers, std::vector<std::string> worker_args = {}) {
  worker_args.push_back("--checkpoint_root=" + Root());
  return StartCluster(workers, {"--checkpoint_root=" + Root()}, worker_args);
}

std::unique_ptr<Client> Connect(const LocalCluster& fleet) {
  auto c = Client::Connect(fleet.controller_address());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A small decoder (odd-sized, so pieces are uneven) on `mesh` with `plan`.
baton::v1::JobSpec Decoder(const std::string& mesh, const std::string& plan, int steps = 10) {
  auto job = ParseJobSpec(absl::StrCat(R"pb(
    name: "ckpt"
    model { decoder { vocab: 126 dim: 40 layers: 2 heads: 4 ffn_dim: 72 seq_len: 16 } }
    )pb", mesh, " plan { ", plan, R"pb( }
    optimizer { lr: 0.003 weight_decay: 0.01 }
    data { synthetic {} batch_size: 8 microbatches: 2 }
    seed: 7
    steps: )pb", steps),
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

baton::v1::JobSpec Fsdp(int dp, int steps = 10) {
  return Decoder(absl::StrCat("mesh { name: \"dp\" size: ", dp, " }"), "mode: FSDP", steps);
}

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
  auto fleet = Fleet(4);
  ASSERT_NE(fleet, nullptr);
  auto client = Connect(*fleet);
  auto job = Job::Create(client.get(), Fsdp(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(3).ok());
  auto saved = (*job)->Save("reshard/fsdp2");
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE((*job)->Stop().ok());
  const std::vector<std::pair<std::string, baton::v1::JobSpec>> targets = {
      {"fsdp1", Fsdp(1)},
      {"fsdp4", Fsdp(4)},
      {"ddp2", Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: DDP")},
      {"zero1_4", Decoder(R"pb(mesh { name: "dp" size: 4 })pb", "mode: ZERO1")},
      {"dp2_tp2", Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
                          R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb")},
      {"pp2", Decoder(R"pb(mesh { name: "pp" size: 2 })pb",
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
    auto fleet = Fleet(4);
    ASSERT_NE(fleet, nullptr);
    auto client = Connect(*fleet);
    auto job = Job::Create(client.get(), Fsdp(2));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE((*job)->Step(5).ok());
    ASSERT_TRUE((*job)->Save("resume").ok());
    ASSERT_TRUE((*job)->Step(5).ok());
    full = Losses((*job)->metrics());
    ASSERT_EQ(full.size(), 10u);
    StopAndExpectAllGone(*fleet);
  }
  auto fleet = Fleet(4);
  ASSERT_NE(fleet, nullptr);
  auto client = Connect(*fleet);
  const std::vector<std::tuple<std::string, baton::v1::JobSpec, double>> layouts = {
      {"same plan (FSDP dp=2)", Fsdp(2), 0.0},
      {"FSDP dp=4", Fsdp(4), 1e-5},
      {"FSDP dp=2 x TP tp=2", Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
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

// A worker SIGKILLed while an async save writes: the partial checkpoint is
// invisible, the previous one loads (ten times over, each round resuming
// the survivor of the last).
TEST(CheckpointTest, KilledMidSaveLeavesThePreviousCheckpoint) {
  std::mt19937 rng(42);
  int invisible = 0, killed_midway = 0, loadable = 0;
  const int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    // Each piece written costs 25 ms: a save of 57 pieces per rank takes
    // ~1.4 s, the kill comes 0.05-0.6 s into it.
    auto fleet = Fleet(2, {"--testing_write_delay_ms=25"});
    ASSERT_NE(fleet, nullptr);
    auto client = Connect(*fleet);
    auto job = round == 0 ? Job::Create(client.get(), Fsdp(2, 40)) : Job::Restore(client.get(), Fsdp(2, 40), "atomic");
    ASSERT_TRUE(job.ok()) << "round " << round << ": " << job.status();
    loadable += round > 0;
    ASSERT_EQ((*job)->step(), round);  // the last round's save that survived
    ASSERT_TRUE((*job)->Step(1).ok());
    auto good = (*job)->Save("atomic");
    ASSERT_TRUE(good.ok()) << good.status();
    ASSERT_TRUE((*job)->Step(1).ok());
    auto partial = (*job)->Save("atomic", /*async=*/true);
    ASSERT_TRUE(partial.ok()) << partial.status();
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(50, 600)(rng)));
    ASSERT_EQ(kill(testing::PidOf(*fleet, "worker-1"), SIGKILL), 0);
    auto waited = (*job)->WaitForSave();
    auto found = FindCheckpoint(absl::StrCat(Root(), "/atomic"));
    ASSERT_TRUE(found.ok()) << found.status();
    killed_midway += !waited.ok();
    invisible += !waited.ok() && absl::EndsWith(*found, StepDirName(good->step()));
    auto md = ReadMetadata(*found);
    ASSERT_TRUE(md.ok());
    EXPECT_TRUE(VerifyCheckpoint(*found, *md).ok());
    std::printf("round %d: killed worker-1 during the save of step %d (%s); newest checkpoint %s\n", round,
                partial->step(), waited.ok() ? "it finished first" : std::string(waited.status().message()).substr(0, 70).c_str(),
                found->substr(found->rfind('/') + 1).c_str());
    StopAndExpectAllGone(*fleet);
  }
  std::printf("%d of %d saves killed midway (of %d rounds) stayed invisible; the previous checkpoint loaded %d of %d "
              "times\n", invisible, killed_midway, kRounds, loadable, kRounds - 1);
  EXPECT_EQ(invisible, killed_midway);
  EXPECT_GE(killed_midway, kRounds / 2) << "most kills should land during the save";
  EXPECT_EQ(loadable, kRounds - 1);
}

TEST(CheckpointTest, AsyncSaveLetsStepsGoOn) {
  // 30 ms per piece written: the save (~1.7 s) outlasts three steps on a slow machine too.
  auto fleet = Fleet(2, {"--testing_write_delay_ms=30"});
  ASSERT_NE(fleet, nullptr);
  auto client = Connect(*fleet);
  auto job = Job::Create(client.get(), Fsdp(2, 20));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(2).ok());
  const absl::Time start = absl::Now();
  auto async = (*job)->Save("async", /*async=*/true);
  ASSERT_TRUE(async.ok()) << async.status();
  auto during = (*job)->Step(3);
  ASSERT_TRUE(during.ok()) << during.status();
  const int in_flight_after_steps = (*job)->status().checkpoint_in_flight_step();
  const double steps_done_s = absl::ToDoubleSeconds(absl::Now() - start);
  auto published = (*job)->WaitForSave();
  ASSERT_TRUE(published.ok()) << published.status();
  std::printf("async save of step %d: copied in %.3f s; 3 steps done %.3f s after it began, with the save still in "
              "flight (in-flight step %d); published after %.3f s\n",
              async->step(), async->copy_seconds(), steps_done_s, in_flight_after_steps, published->seconds());
  EXPECT_EQ(in_flight_after_steps, 2);
  EXPECT_EQ(published->step(), 2);
  EXPECT_EQ((*job)->status().checkpoint_in_flight_step(), 0);
  auto md = ReadMetadata(published->path());
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_TRUE(VerifyCheckpoint(published->path(), *md).ok());
  // The saved state is step 2's: resuming from it repeats steps 3..5 exactly.
  ASSERT_TRUE((*job)->Stop().ok());
  auto resumed = Job::Restore(client.get(), Fsdp(2, 20), published->path());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  auto again = (*resumed)->Step(3);
  ASSERT_TRUE(again.ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*again)[i].loss(), (*during)[i].loss()) << "step " << 3 + i;
  StopAndExpectAllGone(*fleet);
}

TEST(CheckpointTest, FlippedByteFailsTheLoadNamingFileAndTensor) {
  auto fleet = Fleet(2);
  ASSERT_NE(fleet, nullptr);
  auto client = Connect(*fleet);
  auto job = Job::Create(client.get(), Fsdp(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(1).ok());
  auto saved = (*job)->Save("corrupt");
  ASSERT_TRUE(saved.ok());
  ASSERT_TRUE((*job)->Stop().ok());
  auto md = ReadMetadata(saved->path());
  ASSERT_TRUE(md.ok());
  // A byte in the middle of the biggest chunk of rank 1's file.
  const baton::v1::CheckpointTensor* victim = nullptr;
  const baton::v1::CheckpointChunk* chunk = nullptr;
  for (const auto& t : md->tensors()) {
    for (const auto& c : t.chunks()) {
      if (absl::StartsWith(c.file(), "rank-00001") && (chunk == nullptr || c.length() > chunk->length())) {
        victim = &t;
        chunk = &c;
      }
    }
  }
  ASSERT_NE(chunk, nullptr);
  const std::string file = absl::StrCat(saved->path(), "/", chunk->file());
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b;
  const off_t at = chunk->byte_offset() + chunk->length() / 2;
  ASSERT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::close(fd);
  auto loaded = Job::Restore(client.get(), Fsdp(2), saved->path());
  ASSERT_FALSE(loaded.ok());
  std::printf("load after flipping byte %lld of %s: %s\n", static_cast<long long>(at), chunk->file().c_str(),
              loaded.status().ToString().c_str());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), file));
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), victim->name()));
  // Nothing half-loaded: the fleet trains the next job.
  auto next = Job::Create(client.get(), Fsdp(2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Step(1).ok());
  StopAndExpectAllGone(*fleet);
}

TEST(CheckpointTest, BadInputIsRefusedAndTheFleetStaysUsable) {
  auto fleet = Fleet(2);
  ASSERT_NE(fleet, nullptr);
  auto client = Connect(*fleet);
  auto job = Job::Create(client.get(), Fsdp(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(1).ok());
  auto saved = (*job)->Save("bad/good");
  ASSERT_TRUE(saved.ok());
  auto outside = (*job)->Save("/tmp/baton-escape");
  auto dotdot = (*job)->Save("../escape");
  ASSERT_TRUE((*job)->Stop().ok());
  ASSERT_TRUE(MakeDirs(Root() + "/bad/foreign").ok());
  { std::FILE* f = std::fopen((Root() + "/bad/foreign/notes.txt").c_str(), "w"); std::fputs("hi", f); std::fclose(f); }
  auto mlp = ParseJobSpec(R"pb(
    model { mlp { d_model: 16 blocks: 2 } } mesh { name: "dp" size: 2 } plan { mode: FSDP }
    optimizer { lr: 0.01 } data { batch_size: 8 } steps: 4
  )pb", false);
  ASSERT_TRUE(mlp.ok());
  // Same model family, another width: the export fits no piece of it.
  ASSERT_EQ(RunCommand({testing::BatonBinary(), "checkpoint", "export", saved->path(), Root() + "/bad/w40.safetensors"},
                       absl::Seconds(30)).exit_code, 0);
  baton::v1::JobSpec wider = Fsdp(2);
  wider.mutable_model()->mutable_decoder()->set_dim(48);
  wider.set_init_from("bad/w40.safetensors");
  baton::v1::JobSpec shadow = Fsdp(2);
  shadow.mutable_data()->mutable_token_file()->set_path("/etc/passwd");
  shadow.mutable_data()->mutable_token_file()->set_format(baton::v1::TokenFile::UINT16);
  const std::vector<std::pair<std::string, absl::Status>> cases = {
      {"save to an absolute path outside the root", outside.status()},
      {"save to ../escape", dotdot.status()},
      {"resume from a missing directory", Job::Restore(client.get(), Fsdp(2), "bad/missing").status()},
      {"resume from a foreign directory", Job::Restore(client.get(), Fsdp(2), "bad/foreign").status()},
      {"resume from /etc", Job::Restore(client.get(), Fsdp(2), "/etc").status()},
      {"resume a model from another's checkpoint", Job::Restore(client.get(), *mlp, "bad/good").status()},
      {"init_from weights whose shapes do not fit", Job::Create(client.get(), wider).status()},
      {"a token file outside the data root", Job::Create(client.get(), shadow).status()},
  };
  for (const auto& [what, status] : cases) {
    std::printf("%-44s -> %s\n", what.c_str(), status.ToString().substr(0, 150).c_str());
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_FALSE(absl::StrContains(status.message(), "terminate")) << what;
  }
  EXPECT_TRUE(absl::IsPermissionDenied(cases[0].second));
  EXPECT_TRUE(absl::IsPermissionDenied(cases[1].second));
  EXPECT_TRUE(absl::IsNotFound(cases[2].second));
  EXPECT_TRUE(absl::IsNotFound(cases[3].second));
  EXPECT_TRUE(absl::IsPermissionDenied(cases[4].second));
  EXPECT_TRUE(absl::StrContains(cases[5].second.message(), "another model"));
  EXPECT_TRUE(absl::StrContains(cases[6].second.message(), "shape"));
  EXPECT_TRUE(absl::StrContains(cases[7].second.message(), "outside the file root")) << cases[7].second;
  auto next = Job::Create(client.get(), Fsdp(2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Step(2).ok());
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
  ASSERT_EQ(access(kPython, X_OK), 0) << kPython << " is missing: ./dev.sh installs python3-torch";
  auto fleet = Fleet(4);
  ASSERT_NE(fleet, nullptr);
  auto client = Connect(*fleet);
  const baton::v1::JobSpec spec = Fsdp(2);
  // The job file the oracle reads: the same spec, as text.
  const std::string job_file = Root() + "/export_job.textproto";
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
  const std::string init_out = Root() + "/export/init.safetensors", w4 = Root() + "/export/step4.safetensors";
  for (const auto& [dir, out] : {std::pair{at0->path(), init_out}, std::pair{at4->path(), w4}}) {
    auto r = RunCommand({testing::BatonBinary(), "checkpoint", "export", dir, out}, absl::Seconds(60));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string oracle = Runfile("tests/oracle/oracle.py");
  const std::string init = PythonJson({kPython, oracle, "--init-diff", init_out, job_file});
  std::printf("exported initial weights vs the oracle's: %s", init.c_str());
  EXPECT_EQ(testing::Field(init, "mismatched"), 0);
  EXPECT_EQ(testing::Field(init, "max_abs_diff"), 0);
  const std::string next = PythonJson({kPython, oracle, "--next-loss", w4, "--step", "4", job_file});
  const double oracle_loss = testing::Field(next, "loss"), baton_loss = (*step5)[0].loss();
  const double rel = std::abs(oracle_loss - baton_loss) / std::abs(baton_loss);
  std::printf("step 5 loss from the exported step-4 weights: oracle %.8f, Baton %.8f, relative difference %.3g\n",
              oracle_loss, baton_loss, rel);
  EXPECT_LE(rel, 1e-5);

  // init_from the export onto FSDP x TP, saved at once and exported again.
  baton::v1::JobSpec tp = Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
                                  R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb");
  tp.set_init_from("export/step4.safetensors");
  auto from = Job::Create(client.get(), tp);
  ASSERT_TRUE(from.ok()) << from.status();
  auto resaved = (*from)->Save("export/roundtrip");
  ASSERT_TRUE(resaved.ok());
  const std::string again = Root() + "/export/roundtrip.safetensors";
  ASSERT_EQ(RunCommand({testing::BatonBinary(), "checkpoint", "export", resaved->path(), again}, absl::Seconds(60))
                .exit_code,
            0);
  auto a = ReadSafetensors(w4), b = ReadSafetensors(again);
  ASSERT_TRUE(a.ok() && b.ok());
  int64_t differing = 0;
  ASSERT_EQ(a->tensors_size(), b->tensors_size());
  for (int i = 0; i < a->tensors_size(); ++i) {
    auto va = ReadTensor(Root() + "/export", *a, a->tensors(i)), vb = ReadTensor(Root() + "/export", *b, b->tensors(i));
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
