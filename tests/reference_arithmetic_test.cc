// The single-process reference computes as the workers do: the same kernels,
// the same one-pass AdamW, the batch split as the data-parallel ranks split
// it and their gradients combined in rank order. A small GQA decoder at seed
// 3 shows why it must: with the whole batch in one pass (as before) the
// reference's gradient norms differed from the ranks' after ten AdamW steps
// by as much as either differs from a float64 run (~1e-5): a gradient near
// AdamW's eps turns the last bits of a different summation order into that
// drift. Now the two are one computation, bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tests/process_util.h"
#include "tests/step_lines.h"
#include "tests/training_harness.h"

namespace baton {
namespace {

constexpr char kJob[] = R"pb(
  name: "gqa_seed3"
  model {
    decoder {
      vocab: 64 dim: 32 layers: 2 heads: 4 n_kv_heads: 2 seq_len: 16 mlp: SWIGLU ffn_dim: 0 multiple_of: 16
    }
  }
  mesh { name: "dp" size: 2 }
  plan { mode: FSDP }
  optimizer { lr: 0.004 }
  data { synthetic {} batch_size: 8 }
  steps: 10
  seed: 3
)pb";

TEST(ReferenceArithmeticTest, TheReferenceTrainsAsTheWorkersDo) {
  const baton::v1::JobSpec job = testing::Job(kJob);
  const int steps = job.steps();
  std::vector<double> ref_norms;
  auto lock = testing::TrainInLockstep(job, steps, [&](testing::Distributed&, ReferenceTrainer& ref, int) {
    double sq = 0;
    for (const auto& name : ref.param_names()) sq += ref.grad(name).to(at::kDouble).pow(2).sum().item<double>();
    ref_norms.push_back(std::sqrt(sq));
  });
  const double params = testing::MaxParamDiff(*lock.distributed, *lock.reference);
  const double loss = testing::WorstRelativeLoss(*lock.distributed, lock.ref_loss);
  std::printf("gqa seed 3, FSDP dp=2, %d AdamW steps: reference vs the ranks: max |parameter difference| %.3g, worst "
              "relative loss difference %.3g\n",
              steps, params, loss);
  // The same operations in the same order: the same bits.
  EXPECT_EQ(params, 0.0);
  EXPECT_EQ(loss, 0.0);

  // And against float64 (tests/oracle/oracle.py --float64): within
  // testing::Fp32DriftBound of how far PyTorch's own fp32 run drifts.
  const std::string python = testing::TorchPython();
  ASSERT_EQ(access(python.c_str(), X_OK), 0) << python << " is missing: ./dev.sh makes the Python environment";
  const std::string file = testing::TempDir("reference-arithmetic") + "/gqa_seed3.textproto";
  std::ofstream(file) << kJob;
  auto norms = [&](bool float64) {
    std::vector<std::string> argv = {python, testing::Runfile("tests/oracle/oracle.py")};
    if (float64) argv.push_back("--float64");
    argv.push_back(file);
    auto run = testing::RunCommand(argv, absl::Seconds(120));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    std::vector<double> v;
    for (const auto& line : testing::JsonLines(run.output, "{\"job\":")) v.push_back(testing::Field(line, "grad_norm"));
    return v;
  };
  const std::vector<double> torch32 = norms(false), exact = norms(true);
  ASSERT_EQ(torch32.size(), ref_norms.size());
  ASSERT_EQ(exact.size(), ref_norms.size());
  double ours = 0, theirs = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    ours = std::max(ours, std::abs(ref_norms[i] - exact[i]) / exact[i]);
    theirs = std::max(theirs, std::abs(torch32[i] - exact[i]) / exact[i]);
  }
  std::printf("gradient norms over %d steps vs float64: reference %.3g, PyTorch fp32 %.3g (bound %.3g)\n", steps,
              ours, theirs, testing::Fp32DriftBound(theirs));
  EXPECT_LE(ours, testing::Fp32DriftBound(theirs));
}

}  // namespace
}  // namespace baton
