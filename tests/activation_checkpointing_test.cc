// Activation checkpointing on in-process ranks: FULL and SELECTIVE give the
// same run as no checkpointing, bit for bit - every rank's losses, gradient
// norms, gradients after step 1 and parameters after the last step - under
// FSDP, ZeRO-2 x pipelines (GPipe, 1F1B, interleaved), tensor parallelism
// with sequence and loss parallelism, and an MLP. The recomputed forwards'
// tensor-parallel collectives are in the measured traffic, and it equals
// the theory's. Also: the planner marks the blocks it should, and a bad
// `every` is refused.
#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "strategies/planner.h"
#include "tests/training_harness.h"

namespace baton {
namespace {

using testing::Job;
using testing::With;

struct AcCase {
  const char* name;
  std::string job;  // holds "plan { " once: checkpointing goes there
};

const AcCase kCases[] = {
    {"fsdp_dp2_gqa",
     R"pb(model { decoder { vocab: 40 dim: 24 layers: 3 heads: 6 n_kv_heads: 2 ffn_dim: 40 seq_len: 7 mlp: SWIGLU } }
          mesh { name: "dp" size: 2 }
          plan { mode: FSDP }
          optimizer { lr: 0.01 max_grad_norm: 1.0 }
          data { batch_size: 6 microbatches: 3 }
          steps: 3 seed: 3)pb"},
    {"tp2_sp_lp",
     R"pb(model { decoder { vocab: 32 dim: 16 layers: 4 heads: 4 n_kv_heads: 2 ffn_dim: 24 seq_len: 8 mlp: SWIGLU } }
          mesh { name: "tp" size: 2 }
          plan { mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true loss_parallel: true } }
          optimizer { lr: 0.01 }
          data { batch_size: 4 }
          steps: 3 seed: 4)pb"},
    {"pp2_1f1b_x_zero2",
     R"pb(model { decoder { vocab: 30 dim: 16 layers: 4 heads: 2 ffn_dim: 20 seq_len: 5 } }
          mesh { name: "dp" size: 2 } mesh { name: "pp" size: 2 }
          plan { mode: ZERO2 pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B } }
          optimizer { lr: 0.01 }
          data { batch_size: 8 microbatches: 4 }
          steps: 3 seed: 5)pb"},
    {"pp2_interleaved_x_tp2",
     R"pb(model { decoder { vocab: 32 dim: 16 layers: 4 heads: 2 ffn_dim: 24 seq_len: 6 } }
          mesh { name: "pp" size: 2 } mesh { name: "tp" size: 2 }
          plan { mode: FSDP
            tensor_parallel { axis: "tp" sequence_parallel: true }
            pipeline_parallel { axis: "pp" schedule: INTERLEAVED_1F1B virtual_stages: 2 }
          }
          optimizer { lr: 0.01 }
          data { batch_size: 4 microbatches: 4 }
          steps: 2 seed: 6)pb"},
    {"mlp_pp2_gpipe",
     R"pb(model { mlp { d_model: 12 hidden: 20 blocks: 4 } }
          mesh { name: "pp" size: 2 }
          plan { mode: DDP pipeline_parallel { axis: "pp" schedule: GPIPE } }
          optimizer { lr: 0.01 }
          data { batch_size: 6 microbatches: 3 }
          steps: 2 seed: 7)pb"},
};

// Every figure two runs of one job can differ in, rank by rank: how many
// losses, gradient norms, gradient and parameter elements differ in any bit.
struct Differences {
  int metrics = 0;
  int64_t grads = 0, params = 0;
  int64_t compared = 0;  // elements
};

int64_t BitsDiffer(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return std::max<int64_t>(a.numel(), 1);
  return a.ne(b).sum().item<int64_t>();
}

Differences Compare(testing::Distributed& a, testing::Distributed& b,
                    const std::vector<std::vector<at::Tensor>>& grads_a,
                    const std::vector<std::vector<at::Tensor>>& grads_b) {
  Differences d;
  for (size_t r = 0; r < a.executors.size(); ++r) {
    for (size_t s = 0; s < a.metrics[r].size(); ++s) {
      const auto &x = a.metrics[r][s], &y = b.metrics[r][s];
      const double values[4] = {x.loss(), y.loss(), x.grad_norm(), y.grad_norm()};
      d.metrics += std::memcmp(&values[0], &values[1], sizeof(double)) != 0 ||
                   std::memcmp(&values[2], &values[3], sizeof(double)) != 0;
    }
    for (size_t i = 0; i < grads_a[r].size(); ++i) d.grads += BitsDiffer(grads_a[r][i], grads_b[r][i]);
    for (const auto& unit : a.executors[r]->program().units()) {
      for (const auto& param : unit.params()) {
        auto pa = a.executors[r]->MasterShard(param.name()), pb = b.executors[r]->MasterShard(param.name());
        EXPECT_TRUE(pa.ok() && pb.ok()) << param.name();
        if (!pa.ok() || !pb.ok()) continue;
        d.params += BitsDiffer(*pa, *pb);
        d.compared += pa->numel();
      }
    }
  }
  return d;
}

// Every rank's gradient pieces right after step 1.
std::function<void(testing::Distributed&, int)> KeepStep1Grads(std::vector<std::vector<at::Tensor>>* out) {
  return [out](testing::Distributed& d, int step) {
    if (step != 1) return;
    out->assign(d.executors.size(), {});
    for (size_t r = 0; r < d.executors.size(); ++r) {
      for (const auto& unit : d.executors[r]->program().units()) {
        for (const auto& param : unit.params()) {
          auto g = d.executors[r]->LastGradShard(param.name());
          if (g.ok()) (*out)[r].push_back(g->clone());
        }
      }
    }
  };
}

class ActivationCheckpointingTest : public ::testing::TestWithParam<AcCase> {};

TEST_P(ActivationCheckpointingTest, SameRunBitForBit) {
  const AcCase& c = GetParam();
  const baton::v1::JobSpec plain = Job(c.job);
  std::vector<std::vector<at::Tensor>> plain_grads;
  auto reference = testing::RunDistributed(plain, plain.steps(), KeepStep1Grads(&plain_grads));
  for (const char* mode : {"FULL", "SELECTIVE every: 2"}) {
    const std::string name = absl::StrCat(c.name, " ", mode);
    const baton::v1::JobSpec job =
        Job(With(c.job, "plan { ", absl::StrCat("plan { activation_checkpointing { mode: ", mode, " } ")));
    std::vector<std::vector<at::Tensor>> grads;
    auto ac = testing::RunDistributed(job, job.steps(), KeepStep1Grads(&grads));
    const Differences d = Compare(*reference, *ac, plain_grads, grads);
    int recomputed = 0;
    for (const auto& stage : ac->executors.front()->program().stages()) recomputed += stage.recompute();
    std::printf("%s: %d blocks recomputed; differ from no checkpointing: %d of %zu ranks' step metrics, %lld "
                "gradient and %lld of %lld parameter elements\n",
                name.c_str(), recomputed, d.metrics, ac->executors.size(), static_cast<long long>(d.grads),
                static_cast<long long>(d.params), static_cast<long long>(d.compared));
    EXPECT_GT(recomputed, 0) << name;
    EXPECT_EQ(d.metrics, 0) << name;
    EXPECT_EQ(d.grads, 0) << name;
    EXPECT_EQ(d.params, 0) << name;
    EXPECT_GT(d.compared, 0) << name;
    testing::ExpectAccountingEqualsTheory(name.c_str(), *ac, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, ActivationCheckpointingTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ActivationCheckpointingPlanTest, MarksTheBlocksAndPricesTheRecompute) {
  const std::string base = R"pb(model { decoder { vocab: 32 dim: 16 layers: 5 heads: 2 ffn_dim: 24 seq_len: 8 } }
                                mesh { name: "dp" size: 2 }
                                plan { mode: FSDP }
                                optimizer { lr: 0.01 }
                                data { batch_size: 4 }
                                steps: 1)pb";
  auto marked = [&](const std::string& ac) {
    auto programs = CompilePrograms(Job(With(base, "plan { ", "plan { " + ac)), "t");
    EXPECT_TRUE(programs.ok()) << programs.status();
    std::string out;
    for (const auto& s : programs->front().stages()) out += s.recompute() ? "R" : StageOf(s.kind()).block ? "b" : "-";
    return out;
  };
  EXPECT_EQ(marked(""), "-bbbbb-");
  EXPECT_EQ(marked("activation_checkpointing { mode: FULL } "), "-RRRRR-");
  EXPECT_EQ(marked("activation_checkpointing { mode: SELECTIVE every: 2 } "), "-bRbRb-");  // torchtitan's count
  EXPECT_EQ(marked("activation_checkpointing { mode: SELECTIVE every: 1 } "), "-RRRRR-");
  auto none = ComputeTheory(Job(base));
  auto full = ComputeTheory(Job(With(base, "plan { ", "plan { activation_checkpointing { mode: FULL } ")));
  ASSERT_TRUE(none.ok() && full.ok());
  std::printf("FULL: forward %lld FLOPs/step, recomputed %lld (%.3f); memory %lld -> %lld B\n",
              static_cast<long long>(full->forward_flops), static_cast<long long>(full->recompute_flops),
              static_cast<double>(full->recompute_flops) / full->forward_flops,
              static_cast<long long>(none->memory_bytes), static_cast<long long>(full->memory_bytes));
  EXPECT_EQ(none->recompute_flops, 0);
  EXPECT_GT(full->recompute_flops, 0);
  EXPECT_LT(full->recompute_flops, full->forward_flops);  // the head is not recomputed
  EXPECT_LT(full->memory_bytes, none->memory_bytes);
  auto bad = ParseJobSpec(With(base, "plan { ", "plan { activation_checkpointing { mode: SELECTIVE } "), false);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "every must be in [1,")) << bad.status();
  std::printf("refused: %s\n", bad.status().ToString().c_str());
}

}  // namespace
}  // namespace baton
