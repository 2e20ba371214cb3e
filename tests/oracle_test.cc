// Every example job through the controller against the independent
// PyTorch-Python oracle (tests/oracle/oracle.py, written from the job-file
// contract in docs/model_contract.md and sharing no code with Baton): step by
// step, the loss and the gradient norm. A bug in Baton's model code that the
// single-process reference shares (a wrong attention scale, a wrong Adam bias
// correction) fails here. Also a decoder trained on a text file, for the
// token-file path of both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/local_cluster.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::Field;
using testing::JsonLines;
using testing::Runfile;


TEST(OracleTest, EveryExampleThroughTheControllerMatchesPyTorch) {
  // Every job file in examples/, whatever is added there.
  std::vector<std::string> examples;
  const std::filesystem::path examples_dir = std::filesystem::path(Runfile("examples/mlp_seed_lab.textproto")).parent_path();
  for (const auto& entry : std::filesystem::directory_iterator(examples_dir)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".textproto") || absl::EndsWith(name, ".json")) examples.push_back(name);
  }
  std::sort(examples.begin(), examples.end());
  ASSERT_GE(examples.size(), 19u);
  const std::string dir = testing::TempDir("oracle");
  std::vector<std::string> files;
  for (const auto& e : examples) files.push_back(Runfile("examples/" + e));
  {
    // A decoder on the bytes of a text file (a token file) under HSDP.
    std::ofstream text(dir + "/corpus.txt");
    for (int i = 0; i < 40; ++i) text << "the quick brown fox " << i << " jumps over the lazy dog\n";
    std::ofstream(dir + "/text_bytes.textproto")
        << "name: \"text-bytes\"\n"
        << "model { decoder { vocab: 256 dim: 32 layers: 2 heads: 2 ffn_dim: 48 seq_len: 24 mlp: SWIGLU } }\n"
        << "mesh { name: \"replicate\" size: 2 } mesh { name: \"shard\" size: 2 }\n"
        << "plan { mode: HSDP }\n"
        << "optimizer { lr: 0.003 max_grad_norm: 0.5 }\n"
        << "data { token_file { path: \"" << dir << "/corpus.txt\" format: TEXT_BYTES } batch_size: 8 }\n"
        << "steps: 12 seed: 5\n";
    files.push_back(dir + "/text_bytes.textproto");
    // Odd head_dim (15: the last feature of each head is not rotated), three
    // query heads on one key/value head, FSDP over 3 ranks (padded shards).
    std::ofstream(dir + "/odd_heads.textproto")
        << "name: \"odd-heads\"\n"
        << "model { decoder { vocab: 37 dim: 45 layers: 2 heads: 3 n_kv_heads: 1 ffn_dim: 50 seq_len: 9 "
           "mlp: SWIGLU } }\n"
        << "mesh { name: \"shard\" size: 3 }\n"
        << "plan { mode: FSDP }\n"
        << "optimizer { lr: 0.003 }\n"
        << "data { synthetic {} batch_size: 6 }\n"
        << "steps: 8 seed: 11\n";
    files.push_back(dir + "/odd_heads.textproto");
  }
  const std::string python = testing::TorchPython();
  ASSERT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing: ./dev.sh makes the Python environment";

  // The oracle trains every job in one Python process, beside the fleet,
  // and once more in float64: the truth both fp32 runs drift from.
  std::vector<std::string> oracle_argv = {python, Runfile("tests/oracle/oracle.py")};
  oracle_argv.insert(oracle_argv.end(), files.begin(), files.end());
  auto oracle = testing::StartBackground(oracle_argv, dir + "/oracle.out");
  std::vector<std::string> oracle64_argv = {python, Runfile("tests/oracle/oracle.py"), "--float64"};
  oracle64_argv.insert(oracle64_argv.end(), files.begin(), files.end());
  auto oracle64 = testing::StartBackground(oracle64_argv, dir + "/oracle64.out");

  auto cluster = testing::StartCluster(4, {}, {"--data_root=" + dir});  // where the token file is
  ASSERT_NE(cluster, nullptr);
  std::map<std::string, std::vector<std::string>> runs;
  for (const auto& file : files) {
    auto run = testing::RunCommand({testing::BatonBinary(), "run", "--controller=" + cluster->controller_address(),
                                    file, "--output=json"},
                                   absl::Seconds(120));
    ASSERT_EQ(run.exit_code, 0) << file << ": " << run.output;
    runs[file] = JsonLines(run.output);
  }
  testing::StopAndExpectAllGone(*cluster);
  auto oracle_lines = [&](const testing::Background& process, const std::string& out) {
    bool timed_out = false;
    const int code = testing::WaitBackground(process, absl::Seconds(150), &timed_out);
    const std::string text = testing::ReadFile(out);
    EXPECT_FALSE(timed_out) << out;
    EXPECT_EQ(code, 0) << text;
    std::map<std::string, std::vector<std::string>> by_job;
    for (const auto& line : JsonLines(text, "{\"job\":")) by_job[testing::StringField(line, "job")].push_back(line);
    return by_job;
  };
  auto truth = oracle_lines(oracle, dir + "/oracle.out");
  auto truth64 = oracle_lines(oracle64, dir + "/oracle64.out");
  // Gradient norms after AdamW steps are held to the float64 run, within
  // testing::Fp32DriftBound of how far PyTorch's own fp32 run drifts.
  for (const auto& file : files) {
    const auto& mine = runs[file];
    const auto& theirs = truth[file];
    const auto& exact = truth64[file];
    ASSERT_FALSE(mine.empty()) << file;
    ASSERT_EQ(mine.size(), theirs.size()) << file;
    ASSERT_EQ(mine.size(), exact.size()) << file;
    auto relative = [](double a, double b) { return std::abs(a - b) / std::abs(b); };
    // Losses step by step against PyTorch's fp32; the first gradient norm
    // (the gradients alone, before any update); later norms against float64.
    double loss = 0, torch_loss64 = 0, first_norm = 0, norm64 = 0, torch_norm64 = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      loss = std::max(loss, relative(Field(mine[i], "loss"), Field(theirs[i], "loss")));
      torch_loss64 = std::max(torch_loss64, relative(Field(theirs[i], "loss"), Field(exact[i], "loss")));
      const double g = Field(mine[i], "grad_norm"), h = Field(theirs[i], "grad_norm"), x = Field(exact[i], "grad_norm");
      if (i == 0) {
        first_norm = relative(g, h);
        continue;
      }
      norm64 = std::max(norm64, relative(g, x));
      torch_norm64 = std::max(torch_norm64, relative(h, x));
    }
    const double norm_bound = testing::Fp32DriftBound(torch_norm64);
    // Later losses drift too (3.9e-6 after 20 steps of decoder_ddp here):
    // 1e-5, or kFp32DriftFactor times PyTorch's own drift where that is more.
    const double loss_bound = std::max(1e-5, testing::kFp32DriftFactor * torch_loss64);
    std::printf("%-24s %2zu steps: loss %.6f -> %.6f; vs PyTorch fp32: loss %.3g, grad norm at step 1 %.3g; "
                "later grad norms vs float64: Baton %.3g, PyTorch fp32 %.3g (bound %.3g)%s\n",
                file.substr(file.rfind('/') + 1).c_str(), mine.size(), Field(mine.front(), "loss"),
                Field(mine.back(), "loss"), loss, first_norm, norm64, torch_norm64, norm_bound,
                loss_bound > 1e-5 ? absl::StrCat("; loss bound ", loss_bound).c_str() : "");
    EXPECT_LE(loss, loss_bound) << file;
    EXPECT_LE(first_norm, 1e-6) << file;
    EXPECT_LE(norm64, norm_bound) << file;
  }

  // The seed lab's configuration trained by PyTorch 2.11's FSDP2
  // (fully_shard per block, on two gloo ranks) from Baton's initial weights
  // and batches: Baton's FSDP run of the same job matches it step by step.
  const std::string lab_job = Runfile("examples/mlp_seed_lab.textproto");
  for (const char* reshard : {"1", "0"}) {
    const std::string out = dir + "/fsdp2_" + reshard + ".json";
    auto fsdp2 = testing::RunCommand({python, Runfile("tests/seed_lab/lab.py"), "--fsdp2-job", lab_job, "--out", out,
                                      "--reshard-after-forward", reshard},
                                     absl::Seconds(150));
    ASSERT_EQ(fsdp2.exit_code, 0) << fsdp2.output;
    const std::vector<std::string> steps = JsonLines(fsdp2.output, "{\"fsdp2_step\":");
    const auto& baton = runs[lab_job];
    ASSERT_EQ(steps.size(), baton.size()) << fsdp2.output;
    double loss = 0, norm = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      loss = std::max(loss, std::abs(Field(baton[i], "loss") - Field(steps[i], "loss")) / std::abs(Field(steps[i], "loss")));
      norm = std::max(norm, std::abs(Field(baton[i], "grad_norm") - Field(steps[i], "grad_norm")) /
                                std::abs(Field(steps[i], "grad_norm")));
    }
    std::printf("mlp_seed_lab: Baton FSDP vs PyTorch FSDP2 (reshard_after_forward %s), same initial weights: worst "
                "relative difference loss %.3g, grad norm %.3g over %zu steps\n",
                reshard, loss, norm, steps.size());
    EXPECT_LE(loss, 1e-5);
    EXPECT_LE(norm, 1e-5);
  }

  // The comparison can fail: an oracle that rotates v instead of k, or pairs
  // feature i with i + head_dim / 2 instead of 2i with 2i + 1, is told apart
  // from Baton at once.
  const std::string llama = Runfile("examples/llama_gqa_tp2.textproto");
  for (const char* mutant : {"rope_on_v", "rope_halves"}) {
    setenv("BATON_ORACLE_MUTANT", mutant, 1);
    auto wrong = testing::RunCommand({python, Runfile("tests/oracle/oracle.py"), llama}, absl::Seconds(150));
    unsetenv("BATON_ORACLE_MUTANT");
    ASSERT_EQ(wrong.exit_code, 0) << wrong.output;
    const auto lines = JsonLines(wrong.output, "{\"job\":");
    ASSERT_EQ(lines.size(), runs[llama].size()) << wrong.output;
    double worst = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const double b = Field(lines[i], "loss");
      worst = std::max(worst, std::abs(Field(runs[llama][i], "loss") - b) / std::abs(b));
    }
    std::printf("oracle mutant %-11s vs Baton on llama_gqa_tp2: worst relative loss difference %.3g (> 1e-5: caught)\n",
                mutant, worst);
    EXPECT_GT(worst, 1e-5) << mutant << " went unnoticed";
  }
}

}  // namespace
}  // namespace baton
