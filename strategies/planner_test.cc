#include "strategies/planner.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "strategies/job_spec.h"
#include "strategies/program_check.h"

namespace baton {
namespace {

using baton::v1::Instruction;

baton::v1::JobSpec SeedLab(const std::string& plan = "mode: FSDP", int microbatches = 1) {
  auto job = ParseJobSpec(R"pb(
    model { mlp { d_model: 32 blocks: 4 } }
    mesh { name: "dp" size: 2 }
    plan { )pb" + plan + R"pb( }
    optimizer { lr: 0.01 }
    data { batch_size: 8 microbatches: )pb" + std::to_string(microbatches) + R"pb( }
    steps: 3
  )pb",
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

// Replays a program's gather/free instructions and checks that every stage
// runs with its unit gathered, and how many units are gathered at most.
struct Replay {
  int max_gathered_blocks = 0;  // non-root units gathered or in flight at once
  std::map<int, int> gathers;   // unit -> GATHER_PARAMS count
  std::map<int, int> reduce_scatters;
};

Replay ReplayProgram(const baton::v1::Program& p) {
  Replay r;
  std::set<int> ready, in_flight;
  for (const auto& i : p.instructions()) {
    switch (i.op()) {
      case Instruction::GATHER_PARAMS:
        EXPECT_FALSE(ready.count(i.unit()) || in_flight.count(i.unit())) << "double gather";
        in_flight.insert(i.unit());
        r.gathers[i.unit()]++;
        break;
      case Instruction::WAIT_PARAMS:
        EXPECT_TRUE(in_flight.count(i.unit())) << "wait without gather";
        in_flight.erase(i.unit());
        ready.insert(i.unit());
        break;
      case Instruction::FREE_PARAMS:
        EXPECT_TRUE(ready.count(i.unit()));
        ready.erase(i.unit());
        break;
      case Instruction::FORWARD:
      case Instruction::BACKWARD:
        EXPECT_TRUE(ready.count(p.stages(i.stage()).unit()))
            << "stage " << i.stage() << " runs without its parameters";
        break;
      case Instruction::REDUCE_SCATTER_GRADS:
        r.reduce_scatters[i.unit()]++;
        break;
      default:
        break;
    }
    int blocks = 0;
    for (int u : ready) blocks += u != 0;
    for (int u : in_flight) blocks += u != 0;
    r.max_gathered_blocks = std::max(r.max_gathered_blocks, blocks);
  }
  EXPECT_TRUE(ready.empty() && in_flight.empty()) << "parameters left gathered after the step";
  return r;
}

TEST(PlannerTest, SeedLabShardsFollowTorchChunkAndRankOneHoldsTheEmptyHead) {
  auto programs = CompilePrograms(SeedLab(), "job-1");
  ASSERT_TRUE(programs.ok()) << programs.status();
  ASSERT_EQ(programs->size(), 2u);
  int64_t local[2] = {0, 0}, total = 0;
  for (int r = 0; r < 2; ++r) {
    for (const auto& unit : (*programs)[r].units()) {
      for (const auto& p : unit.params()) {
        int64_t row = 1;
        for (int d = 1; d < p.shape_size(); ++d) row *= p.shape(d);
        local[r] += p.rows() * row;
        if (r == 0) total += p.shape(0) * row;
        if (p.name() == "head.weight" || p.name() == "head.bias") {
          EXPECT_EQ(p.rows(), r == 0 ? 1 : 0) << p.name();
          EXPECT_EQ(p.chunk_rows(), 1);
        }
      }
    }
  }
  EXPECT_EQ(local[0] + local[1], total);
  const double share = static_cast<double>(local[0]) / total;
  std::printf("rank 0 holds %lld of %lld parameter elements: %.4f\n", (long long)local[0],
              (long long)total, share);
  EXPECT_GE(share, 0.45);
  EXPECT_LE(share, 0.55);
}

TEST(PlannerTest, FsdpGathersBlocksTwiceRootOnceAndPrefetchesOneAhead) {
  auto programs = CompilePrograms(SeedLab(), "job-1");
  ASSERT_TRUE(programs.ok());
  Replay r = ReplayProgram((*programs)[0]);
  EXPECT_EQ(r.gathers[0], 1);  // the root keeps its parameters through backward
  for (int u = 1; u <= 4; ++u) {
    // Forward and again for backward; the last block keeps its parameters
    // (backward needs it first).
    EXPECT_EQ(r.gathers[u], u == 4 ? 1 : 2) << "unit " << u;
    EXPECT_EQ(r.reduce_scatters[u], 1);
  }
  EXPECT_EQ(r.reduce_scatters[0], 1);
  std::printf("most blocks gathered at once: %d\n", r.max_gathered_blocks);
  EXPECT_EQ(r.max_gathered_blocks, 2);  // the one computing and the one prefetched
}

TEST(PlannerTest, ReshardLastBlockOnRequest) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP reshard_last_block: true"), "job-1");
  ASSERT_TRUE(programs.ok());
  EXPECT_EQ(ReplayProgram((*programs)[0]).gathers[4], 2);
}

TEST(PlannerTest, WithoutPrefetchOneBlockAtATime) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP prefetch: false"), "job-1");
  ASSERT_TRUE(programs.ok());
  EXPECT_EQ(ReplayProgram((*programs)[1]).max_gathered_blocks, 1);
}

TEST(PlannerTest, AccumulationReducesOnlyOnTheLastMicrobatch) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP", 2), "job-1");
  ASSERT_TRUE(programs.ok());
  Replay r = ReplayProgram((*programs)[0]);
  for (int u = 0; u <= 4; ++u) EXPECT_EQ(r.reduce_scatters[u], 1);
  EXPECT_EQ(r.gathers[1], 4);
  EXPECT_EQ(r.gathers[4], 2);  // the last block: once per microbatch
}

TEST(PlannerTest, ReplicatedModesNeverGatherForCompute) {
  for (const char* plan : {"mode: DDP", "mode: ZERO1", "mode: ZERO2"}) {
    auto programs = CompilePrograms(SeedLab(plan), "job-1");
    ASSERT_TRUE(programs.ok());
    std::map<Instruction::Op, int> ops;
    for (const auto& i : (*programs)[0].instructions()) ops[i.op()]++;
    EXPECT_EQ(ops[Instruction::GATHER_PARAMS], 0) << plan;
    EXPECT_TRUE((*programs)[0].replicated_params());
    if (std::string(plan) == "mode: DDP") {
      EXPECT_EQ(ops[Instruction::ALL_REDUCE_GRADS], 5);
      EXPECT_EQ((*programs)[0].shard_size(), 1);
    } else {
      EXPECT_EQ(ops[Instruction::REDUCE_SCATTER_GRADS], 5) << plan;
      EXPECT_EQ(ops[Instruction::GATHER_UPDATED_PARAMS], 5) << plan;
    }
  }
}

TEST(PlannerTest, HsdpShardsAlongTheLastAxisAndReducesAcrossReplicas) {
  auto job = ParseJobSpec(R"pb(
    model { decoder { vocab: 64 dim: 32 layers: 2 heads: 2 ffn_dim: 64 seq_len: 8 } }
    mesh { name: "replicate" size: 2 } mesh { name: "shard" size: 2 }
    plan { mode: HSDP } optimizer { lr: 0.01 } data { batch_size: 8 } steps: 1
  )pb",
                          false);
  ASSERT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, "j");
  ASSERT_TRUE(programs.ok());
  ASSERT_EQ(programs->size(), 4u);
  EXPECT_EQ((*programs)[3].shard_axis(), "shard");
  EXPECT_EQ((*programs)[3].shard_rank(), 1);
  EXPECT_EQ((*programs)[2].shard_rank(), 0);
  EXPECT_EQ((*programs)[3].dp_rank(), 3);
  int all_reduce = 0;
  for (const auto& i : (*programs)[0].instructions()) {
    if (i.op() == Instruction::ALL_REDUCE_GRADS) {
      EXPECT_EQ(i.axis(), "replicate");
      ++all_reduce;
    }
  }
  EXPECT_EQ(all_reduce, 3);
}

TEST(PlannerTest, CompiledProgramsPassTheWorkersCheckAndBrokenOnesFail) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP", 2), "job-1");
  ASSERT_TRUE(programs.ok());
  for (const auto& p : *programs) EXPECT_TRUE(ValidateProgram(p).ok()) << ValidateProgram(p);
  auto bad = (*programs)[0];
  bad.set_dp_size(0);
  EXPECT_EQ(ValidateProgram(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = (*programs)[0];
  bad.mutable_instructions(3)->set_stage(99);
  EXPECT_EQ(ValidateProgram(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = (*programs)[0];
  bad.mutable_units(0)->mutable_params(0)->set_rows(5);
  EXPECT_EQ(ValidateProgram(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = (*programs)[0];
  bad.mutable_units(1)->mutable_params(0)->clear_shape();
  EXPECT_EQ(ValidateProgram(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = (*programs)[0];
  bad.mutable_job()->mutable_data()->set_microbatches(0);
  std::printf("broken program: %s\n", ValidateProgram(bad).ToString().c_str());
  EXPECT_EQ(ValidateProgram(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlannerTest, TheoryMatchesTheFsdpFormulas) {
  auto job = SeedLab();
  PlanTheory t = ComputeTheory(job);
  const ModelLayout layout = BuildModelLayout(job.model());
  const double root = layout.units[0].numel(), last = layout.units.back().numel();
  const double blocks = layout.parameters() - root - last;
  // 3 P (N-1)/N for resharded units, 2 P (N-1)/N for the root and the last
  // block, which do not reshard; fp32, N = 2.
  EXPECT_EQ(t.comm_bytes, static_cast<int64_t>((3 * blocks + 2 * (root + last)) * 0.5 * 4));
  EXPECT_EQ(t.state_bytes, static_cast<int64_t>(16.0 * layout.parameters() / 2));
  EXPECT_EQ(ComputeTheory(SeedLab("mode: DDP")).comm_bytes,
            static_cast<int64_t>(2.0 * layout.parameters() * 0.5 * 4));
}

}  // namespace
}  // namespace baton
