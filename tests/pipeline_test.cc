// Pipeline parallelism compiled by the planner and run by the Executor on
// in-process ranks with real gloo, against the single-process reference:
// GPipe, 1F1B and interleaved 1F1B on 4 stages, the bubble and the live
// activations they predict and show, and pipelines composed with FSDP and
// with tensor parallelism. Each test prints the figures it asserts on.
#include "strategies/pipeline.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "strategies/job_spec.h"
#include "models/model.h"
#include "tests/training_harness.h"

namespace baton {
namespace {

using testing::Job;
using testing::MaxParamDiff;
using testing::TrainInLockstep;
using testing::WorstRelativeLoss;

std::string PipelineJob(const std::string& schedule, int m, const std::string& mesh = "mesh { name: \"pp\" size: 4 }",
                        const std::string& extra_plan = "", int layers = 8, int steps = 3) {
  return absl::StrCat("model { decoder { vocab: 64 dim: 32 layers: ", layers, " heads: 4 ffn_dim: 64 seq_len: 16 } } ",
                      mesh, " plan { mode: FSDP pipeline_parallel { axis: \"pp\" schedule: ", schedule, " } ",
                      extra_plan, " } optimizer { lr: 0.003 } data { batch_size: ", 2 * m, " microbatches: ", m,
                      " } steps: ", steps, " seed: 3");
}

struct ScheduleCase {
  const char* schedule;
  int m;
};

class PipelineScheduleTest : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(PipelineScheduleTest, FourStagesMatchOneProcess) {
  const ScheduleCase& c = GetParam();
  const auto job = Job(PipelineJob(c.schedule, c.m));
  auto [d, ref, ref_loss, grads] = TrainInLockstep(job, 3);
  ASSERT_EQ(d->metrics.size(), 4u);
  for (size_t s = 0; s < ref_loss.size(); ++s) ASSERT_TRUE(d->metrics[3][s].has_loss());  // the last stage's
  const double worst = WorstRelativeLoss(*d, ref_loss);
  const double params = MaxParamDiff(*d, *ref);
  const std::string name = absl::StrCat(c.schedule, " m=", c.m);
  std::printf(
      "%s: worst relative loss difference %.3g over 3 steps; gradients max abs diff %.3g (ratio %.9f); parameters "
      "after 3 AdamW steps max abs diff %.3g\n",
      name.c_str(), worst, grads.second, grads.first, params);
  EXPECT_LE(worst, 1e-6);
  EXPECT_LE(grads.second, 1e-6);
  EXPECT_LE(params, 1e-6);
  EXPECT_FALSE(d->metrics[0][0].has_loss());
  testing::ExpectAccountingEqualsTheory(name.c_str(), *d, 2);

  // The bubble and the live activations: the timeline the planner predicts,
  // the textbook formula, and what each rank saw (idle = waiting to receive).
  auto pp = PlanPipeline(job, BuildModelLayout(job.model()));
  ASSERT_TRUE(pp.ok());
  auto timeline = SimulatePipeline(*pp, c.m);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  const double formula = BubbleFraction(4, pp->virtual_stages, c.m);
  for (int r = 0; r < 4; ++r) {
    const auto& m = d->metrics[r][2];
    std::printf(
        "  pp rank %d: idle %.3f of the step measured, %.3f predicted, formula %.3f; live microbatches %d (predicted "
        "%d)\n",
        r, m.idle_ms() / m.step_ms(), timeline->idle_fraction[r], formula, m.peak_live_microbatches(),
        timeline->peak_live[r]);
    EXPECT_EQ(m.peak_live_microbatches(), timeline->peak_live[r]) << "rank " << r;
  }
  const int first_stage_live = d->metrics[0][2].peak_live_microbatches();
  if (std::string(c.schedule) == "GPIPE") {
    EXPECT_EQ(first_stage_live, c.m);
  }
  if (std::string(c.schedule) == "ONE_F_ONE_B") {
    EXPECT_LE(first_stage_live, 4);
  }
  for (double idle : timeline->idle_fraction) EXPECT_NEAR(idle, formula, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineScheduleTest,
                         ::testing::Values(ScheduleCase{"GPIPE", 4}, ScheduleCase{"GPIPE", 8},
                                           ScheduleCase{"GPIPE", 16}, ScheduleCase{"ONE_F_ONE_B", 4},
                                           ScheduleCase{"ONE_F_ONE_B", 8}, ScheduleCase{"ONE_F_ONE_B", 16},
                                           ScheduleCase{"INTERLEAVED_1F1B", 4}, ScheduleCase{"INTERLEAVED_1F1B", 8},
                                           ScheduleCase{"INTERLEAVED_1F1B", 16}),
                         [](const ::testing::TestParamInfo<ScheduleCase>& info) {
                           return absl::StrCat(info.param.schedule, "_m", info.param.m);
                         });

// The predicted bubble of every schedule next to the formula, p = 4.
TEST(PipelineTimelineTest, BubbleFollowsTheFormula) {
  for (const char* schedule : {"GPIPE", "ONE_F_ONE_B", "INTERLEAVED_1F1B"}) {
    for (int m : {4, 8, 16}) {
      const auto job = Job(PipelineJob(schedule, m));
      auto pp = PlanPipeline(job, BuildModelLayout(job.model()));
      ASSERT_TRUE(pp.ok()) << pp.status();
      auto timeline = SimulatePipeline(*pp, m);
      ASSERT_TRUE(timeline.ok()) << timeline.status();
      const double formula = BubbleFraction(4, pp->virtual_stages, m);
      std::printf("%-16s m=%-2d: bubble %.4f (rank 0) vs (p-1)/(v m+p-1) = %.4f; first stage holds %d microbatches\n",
                  schedule, m, timeline->idle_fraction[0], formula, timeline->peak_live[0]);
      // The timeline's bubble is the formula's: chunks of equal cost, a
      // backward twice a forward (interleaving divides it by about v).
      EXPECT_NEAR(timeline->idle_fraction[0], formula, 1e-12);
      // GPipe keeps every microbatch alive on the first stage; 1F1B at most p.
      if (std::string(schedule) == "GPIPE") {
        EXPECT_EQ(timeline->peak_live[0], m);
      }
      if (std::string(schedule) == "ONE_F_ONE_B") {
        EXPECT_EQ(timeline->peak_live[0], std::min(m, 4));
      }
      EXPECT_LE(timeline->peak_live[0], m);
    }
  }
}

// Shapes no example has: two ranks interleaving three chunks each (their
// activations and gradients share one channel per direction), three stages of
// an explicit uneven split, fewer microbatches than stages, an MLP, bf16.
struct OddCase {
  const char* name;
  std::string job;
  // Loss and gradients; parameters after AdamW, which turns rounding in
  // a sharded clip norm into up to lr-sized steps on near-zero gradients.
  double tolerance, param_tolerance;
};

class PipelineShapesTest : public ::testing::TestWithParam<OddCase> {};

TEST_P(PipelineShapesTest, MatchOneProcess) {
  const OddCase& c = GetParam();
  const auto job = Job(c.job);
  auto [d, ref, ref_loss, grads] = TrainInLockstep(job, 2);
  int reporting = 0;
  for (const auto& rank : d->metrics) reporting += rank.back().has_loss();
  const double worst = WorstRelativeLoss(*d, ref_loss);
  const double params = MaxParamDiff(*d, *ref);
  std::printf(
      "%s: worst relative loss difference %.3g; gradients max abs diff %.3g (ratio %.9f); parameters max abs diff "
      "%.3g\n",
      c.name, worst, grads.second, grads.first, params);
  EXPECT_GT(reporting, 0);
  EXPECT_LE(worst, c.tolerance);
  EXPECT_LE(grads.second, c.tolerance);
  EXPECT_LE(params, c.param_tolerance);
  testing::ExpectAccountingEqualsTheory(c.name, *d, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PipelineShapesTest,
    ::testing::Values(OddCase{"pp2_interleaved_v3_m4",
                              R"pb(model { decoder { vocab: 40 dim: 24 layers: 7 heads: 3 ffn_dim: 40 seq_len: 10 } }
                                   mesh { name: "pp" size: 2 }
                                   plan {
                                     mode: FSDP
                                     pipeline_parallel { axis: "pp" schedule: INTERLEAVED_1F1B virtual_stages: 3 }
                                   }
                                   optimizer { lr: 0.003 }
                                   data { batch_size: 4 microbatches: 4 }
                                   steps: 2
                                   seed: 5)pb",
                              1e-6, 1e-6},
                      OddCase{"pp3_split_1_3_1_gpipe_x_zero2",
                              R"pb(model { decoder { vocab: 50 dim: 16 layers: 5 heads: 2 ffn_dim: 24 seq_len: 6 } }
                                   mesh { name: "dp" size: 2 }
                                   mesh { name: "pp" size: 3 }
                                   plan {
                                     mode: ZERO2
                                     pipeline_parallel {
                                       axis: "pp"
                                       schedule: GPIPE
                                       split: [ 1, 3, 1 ]
                                     }
                                   }
                                   optimizer { lr: 0.01 max_grad_norm: 0.5 }
                                   data { batch_size: 6 microbatches: 3 }
                                   steps: 2
                                   seed: 7)pb",
                              // Parameters: 1.6e-5 measured with rotary positions (lr 0.01: an
                              // element whose gradient is near AdamW's eps moves by a share of lr).
                              1e-6, 5e-5},
                      OddCase{"pp4_1f1b_m2_mlp",
                              R"pb(model { mlp { d_model: 12 hidden: 20 blocks: 5 } }
                                   mesh { name: "pp" size: 4 }
                                   plan {
                                     mode: DDP
                                     pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B }
                                   }
                                   optimizer { lr: 0.01 }
                                   data { batch_size: 6 microbatches: 2 }
                                   steps: 2
                                   seed: 9)pb",
                              1e-6, 1e-6},
                      OddCase{"pp2_1f1b_m5_x_hsdp_bf16",
                              R"pb(model { decoder { vocab: 32 dim: 16 layers: 3 heads: 2 ffn_dim: 32 seq_len: 8 } }
                                   mesh { name: "pp" size: 2 }
                                   mesh { name: "r" size: 1 }
                                   mesh { name: "s" size: 2 }
                                   plan {
                                     mode: HSDP
                                     pipeline_parallel { axis: "pp" schedule: ONE_F_ONE_B }
                                     mixed_precision { param_dtype: BF16 }
                                   }
                                   optimizer { lr: 0.01 }
                                   data { batch_size: 10 microbatches: 5 }
                                   steps: 2
                                   seed: 11)pb",
                              // bf16 compute against the fp32 reference (2 lr-sized steps).
                              2e-2, 5e-2}),
    [](const ::testing::TestParamInfo<OddCase>& info) { return std::string(info.param.name); });

// Pipelines composed with the other parallelisms, 10 steps.
struct ThreeDCase {
  const char* name;
  std::string mesh, plan;
};

class PipelineCompositionTest : public ::testing::TestWithParam<ThreeDCase> {};

TEST_P(PipelineCompositionTest, TenStepsFollowTheReference) {
  const ThreeDCase& c = GetParam();
  const auto job = Job(PipelineJob("ONE_F_ONE_B", 4, c.mesh, c.plan, 4, 10));
  auto [d, ref, ref_loss, grads] = TrainInLockstep(job, 10);
  const double worst = WorstRelativeLoss(*d, ref_loss);
  std::printf("%s: loss %.6f -> %.6f, worst relative loss difference over 10 steps %.3g\n", c.name, ref_loss.front(),
              ref_loss.back(), worst);
  EXPECT_LE(worst, 1e-5);
  testing::ExpectAccountingEqualsTheory(c.name, *d, 9);
}

INSTANTIATE_TEST_SUITE_P(
    ThreeD, PipelineCompositionTest,
    ::testing::Values(ThreeDCase{"pp2_x_fsdp2", "mesh { name: \"pp\" size: 2 } mesh { name: \"dp\" size: 2 }", ""},
                      ThreeDCase{"pp2_x_tp2_sp_lp", "mesh { name: \"pp\" size: 2 } mesh { name: \"tp\" size: 2 }",
                                 "tensor_parallel { axis: \"tp\" sequence_parallel: true loss_parallel: true }"}),
    [](const ::testing::TestParamInfo<ThreeDCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace baton
