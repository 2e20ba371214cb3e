// The planner's context parallelism: the head-tail sequence layout in every
// Program, rows split over the data axes but cp, activations between
// pipeline stages of seq / cp positions, the ring's bytes in the theory, and
// the errors that name what does not divide.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "program/program_check.h"
#include "program/sequence_shards.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "strategies/planner.h"

namespace baton {
namespace {

using baton::v1::Instruction;

absl::StatusOr<baton::v1::JobSpec> Decoder(const std::string& mesh_and_plan, int seq = 16, int batch = 4) {
  return ParseJobSpec(R"pb(
    model { decoder { vocab: 64 dim: 32 layers: 2 heads: 4 n_kv_heads: 2 ffn_dim: 64 seq_len: )pb" +
                          std::to_string(seq) + R"pb( } }
    optimizer { lr: 0.01 } data { batch_size: )pb" + std::to_string(batch) + R"pb( } steps: 1 )pb" +
                          mesh_and_plan,
                      false);
}

TEST(ContextParallelPlanTest, HeadTailLayoutAndRowsSplitOnlyOverDataAxes) {
  auto job = Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "cp" size: 4 }
                          plan { mode: HSDP context_parallel { axis: "cp" } })pb");
  ASSERT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, "cp");
  ASSERT_TRUE(programs.ok()) << programs.status();
  const DeviceMesh mesh = *ToDeviceMesh(job->mesh());
  for (const auto& p : *programs) {
    ASSERT_TRUE(ValidateProgram(p).ok()) << ValidateProgram(p);
    ASSERT_TRUE(p.has_context_parallel());
    EXPECT_EQ(p.context_parallel().chunks(), 8);
    const int cp_rank = *mesh.LocalRank("cp", p.rank()), dp_rank = *mesh.LocalRank("dp", p.rank());
    // Rank r of cp holds chunks r and 7 - r: positions [2r, 2r + 2) and [14 - 2r, 16 - 2r).
    EXPECT_EQ(ChunksOf(p.context_parallel(), cp_rank, 4), (std::vector<int>{cp_rank, 7 - cp_rank}));
    const std::vector<int64_t> pos = PositionsOf(p.context_parallel(), cp_rank, 4, 16);
    EXPECT_EQ(pos, (std::vector<int64_t>{2 * cp_rank, 2 * cp_rank + 1, 14 - 2 * cp_rank, 15 - 2 * cp_rank}));
    // The cp ranks of a replica load the same rows.
    for (const auto& ins : p.instructions()) {
      if (ins.op() != Instruction::LOAD_BATCH) continue;
      EXPECT_EQ(ins.row_offset(), 2 * dp_rank) << "rank " << p.rank();
      EXPECT_EQ(ins.rows(), 2);
    }
    EXPECT_EQ(LocalSequence(p, mesh), 4);
  }
}

TEST(ContextParallelPlanTest, PipelineActivationsCarryThisRanksPositions) {
  auto job = Decoder(R"pb(mesh { name: "pp" size: 2 } mesh { name: "cp" size: 2 } mesh { name: "tp" size: 2 }
                          plan { mode: FSDP context_parallel { axis: "cp" }
                                 tensor_parallel { axis: "tp" sequence_parallel: true }
                                 pipeline_parallel { axis: "pp" } })pb");
  ASSERT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, "cp");
  ASSERT_TRUE(programs.ok()) << programs.status();
  int sends = 0;
  for (const auto& p : *programs) {
    for (const auto& ins : p.instructions()) {
      if (ins.op() != Instruction::SEND_ACTIVATION) continue;
      ++sends;
      // [rows, 16 / cp / tp, dim]
      EXPECT_EQ(std::vector<int64_t>(ins.shape().begin(), ins.shape().end()), (std::vector<int64_t>{4, 4, 32}));
    }
  }
  EXPECT_GT(sends, 0);
}

TEST(ContextParallelPlanTest, TheRingIsPricedInTheTheory) {
  // The same job with and without cp = 2 over 2 ranks: FSDP's bytes are the
  // same (over cp instead of dp); the ring adds per block, per rank:
  // forward (cp - 1) x K and V, backward that again and cp x their fp32
  // gradients. K, V: [4 rows, 2 kv heads, 8 positions, 8 features] fp32.
  auto with = Decoder(R"pb(mesh { name: "cp" size: 2 } plan { mode: FSDP context_parallel { axis: "cp" } })pb");
  auto without = Decoder(R"pb(mesh { name: "cp" size: 2 } plan { mode: FSDP })pb", 16, 8);
  ASSERT_TRUE(with.ok() && without.ok());
  auto a = ComputeTheory(*with), b = ComputeTheory(*without);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const int64_t kv = 2 * 4 * 2 * 8 * 8 * 4;
  const int64_t ring = 2 /* blocks */ * ((2 - 1) * kv + (2 - 1) * kv + 2 * kv);
  std::printf("comm per rank and step: cp=2 %lld B, dp=2 %lld B; the ring's %lld B\n", (long long)a->comm_bytes,
              (long long)b->comm_bytes, (long long)ring);
  EXPECT_EQ(a->comm_bytes - b->comm_bytes, ring);
  // Live activations: each rank holds [4 rows, 8 positions, 32] per block
  // output, against [4, 16, 32] for dp's 4 rows of whole sequences.
  EXPECT_LT(a->peak_live_activation_bytes, b->peak_live_activation_bytes);
}

TEST(ContextParallelPlanTest, ErrorsNameWhatDoesNotDivide) {
  struct Bad {
    std::string job;
    int seq;
    const char* says;
  };
  for (const Bad& bad : std::vector<Bad>{
           {R"pb(mesh { name: "cp" size: 4 } plan { context_parallel { axis: "cp" } })pb", 12,
            "does not divide into 2 x 4 = 8 chunks"},
           {R"pb(mesh { name: "cp" size: 2 } plan { context_parallel { axis: "sp" } })pb", 16,
            "plan.context_parallel.axis \"sp\" is not an axis of the mesh"},
           {R"pb(mesh { name: "cp" size: 2 } mesh { name: "tp" size: 2 }
                 plan { context_parallel { axis: "tp" } tensor_parallel { axis: "tp" } })pb",
            16, "is also the tensor- or pipeline-parallel axis"},
           {R"pb(mesh { name: "cp" size: 2 } mesh { name: "tp" size: 4 }
                 plan { context_parallel { axis: "cp" } tensor_parallel { axis: "tp" sequence_parallel: true } })pb",
            12, "seq_len 12 / 2 context-parallel ranks does not split over 4 tp ranks"},
           {R"pb(mesh { name: "dp" size: 2 } mesh { name: "cp" size: 2 } plan { context_parallel { axis: "cp" } })pb",
            16, "the context-parallel axis counts as one"},
       }) {
    auto job = Decoder(bad.job, bad.seq);
    ASSERT_FALSE(job.ok()) << bad.job;
    std::printf("refused: %s\n", std::string(job.status().message()).c_str());
    EXPECT_TRUE(absl::StrContains(job.status().message(), bad.says)) << job.status();
  }
  auto mlp = ParseJobSpec(R"pb(model { mlp { d_model: 8 blocks: 2 } } mesh { name: "cp" size: 2 }
                               plan { context_parallel { axis: "cp" } } optimizer { lr: 0.1 }
                               data { batch_size: 2 } steps: 1)pb",
                          false);
  ASSERT_FALSE(mlp.ok());
  EXPECT_TRUE(absl::StrContains(mlp.status().message(), "needs a decoder")) << mlp.status();
}

TEST(ContextParallelPlanTest, TheProgramCheckRefusesABrokenLayout) {
  auto job = Decoder(R"pb(mesh { name: "cp" size: 2 } plan { mode: FSDP context_parallel { axis: "cp" } })pb");
  ASSERT_TRUE(job.ok());
  auto programs = CompilePrograms(*job, "cp");
  ASSERT_TRUE(programs.ok());
  baton::v1::Program p = (*programs)[0];
  p.mutable_context_parallel()->set_rank_chunks(1, 0);  // chunk 0 twice
  EXPECT_FALSE(ValidateProgram(p).ok());
  p = (*programs)[0];
  p.mutable_context_parallel()->set_chunks(3);
  EXPECT_FALSE(ValidateProgram(p).ok());
  p = (*programs)[0];
  p.mutable_context_parallel()->set_axis("nope");
  const absl::Status s = ValidateProgram(p);
  EXPECT_FALSE(s.ok());
  std::printf("a Program naming a missing axis: %s\n", std::string(s.message()).c_str());
}

}  // namespace
}  // namespace baton
