// The planner's Programs: every parameter's layout per mesh axis, the
// worker's own check of what it compiles, and the theory it prints (one
// rank's step is step_writer_test.cc).
#include "strategies/planner.h"

#include <gtest/gtest.h>

#include <set>

#include "program/program_check.h"
#include "program/wire.h"
#include "mesh/layout.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "strategies/testing/plan_jobs.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using testing::Decoder;
using testing::SeedLab;

TEST(PlannerTest, SeedLabShardsFollowTorchChunkAndRankOneHoldsTheEmptyHead) {
  auto programs = CompilePrograms(SeedLab(), "job-1");
  ASSERT_TRUE(programs.ok()) << programs.status();
  ASSERT_EQ(programs->size(), 2u);
  int64_t local[2] = {0, 0}, total = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& program = (*programs)[r];
    auto mesh = ToDeviceMesh(program.mesh());
    ASSERT_TRUE(mesh.ok());
    for (const auto& unit : program.units()) {
      for (const auto& p : unit.params()) {
        auto piece = LocalPiece(*StorageLayout(p, *mesh), *mesh, r);
        ASSERT_TRUE(piece.ok()) << piece.status();
        local[r] += piece->numel();
        if (r == 0) total += LocalPiece(*ComputeLayout(p, *mesh), *mesh, r)->numel();
        if (p.name() == "head.weight" || p.name() == "head.bias") {
          EXPECT_EQ(piece->shape[0], r == 0 ? 1 : 0) << p.name();
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

TEST(PlannerTest, LayoutsArePlacementsPerMeshAxis) {
  auto fsdp = CompilePrograms(SeedLab(), "j");
  auto ddp = CompilePrograms(SeedLab("mode: DDP"), "j");
  auto hsdp = CompilePrograms(Decoder(R"pb(mesh { name: "replicate" size: 2 } mesh { name: "shard" size: 2 })pb",
                                      "mode: HSDP"),
                              "j");
  ASSERT_TRUE(fsdp.ok() && ddp.ok() && hsdp.ok());
  auto describe = [](const baton::v1::Program& program) {
    const DeviceMesh mesh = *ToDeviceMesh(program.mesh());
    const auto& p = program.units(0).params(0);
    return StorageLayout(p, mesh)->ToString() + " | " + ComputeLayout(p, mesh)->ToString();
  };
  EXPECT_EQ(describe((*fsdp)[0]), "(32, 32) Shard(0) | (32, 32) Replicate()");
  EXPECT_EQ(describe((*ddp)[1]), "(32, 32) Replicate() | (32, 32) Replicate()");
  EXPECT_EQ(describe((*hsdp)[3]),
            "(64, 32) Replicate(), Shard(0) | (64, 32) Replicate(), Replicate()");
  EXPECT_FALSE((*fsdp)[0].units(0).resident());
  EXPECT_TRUE((*ddp)[0].units(0).resident());
}

// The embedding and the final norm + head are units of their own (as
// torchtitan wraps them), so a pipeline boundary can fall between them.
TEST(PlannerTest, EmbeddingAndHeadAreSeparateUnits) {
  auto programs = CompilePrograms(Decoder(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP"), "j");
  ASSERT_TRUE(programs.ok());
  const auto& p = (*programs)[0];
  ASSERT_EQ(p.units_size(), 4);
  EXPECT_EQ(p.units(0).name(), "tok_embeddings");
  EXPECT_EQ(p.units(3).name(), "head");
  ASSERT_EQ(p.units(3).params_size(), 2);
  EXPECT_EQ(p.units(3).params(0).name(), "norm.weight");
  EXPECT_EQ(p.units(3).params(1).name(), "output.weight");
  EXPECT_EQ(p.stages(0).unit(), 0);
  EXPECT_EQ(p.stages(p.stages_size() - 1).unit(), 3);
}


TEST(PlannerTest, CompiledProgramsPassTheWorkersCheckAndBrokenOnesFail) {
  for (const char* plan : {"mode: FSDP", "mode: ZERO1", "mode: DDP"}) {
    auto programs = CompilePrograms(SeedLab(plan, 2, "max_grad_norm: 1"), "job-1");
    ASSERT_TRUE(programs.ok());
    for (const auto& p : *programs) EXPECT_TRUE(ValidateProgram(p).ok()) << ValidateProgram(p);
  }
  auto programs = CompilePrograms(SeedLab("mode: FSDP", 2), "job-1");
  ASSERT_TRUE(programs.ok());
  auto expect_refused = [](const baton::v1::Program& bad, const std::string& why) {
    const absl::Status s = ValidateProgram(bad);
    std::printf("refused: %s\n", s.ToString().c_str());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  };
  const auto& good = (*programs)[0];
  auto bad = good;
  bad.set_rank(2);
  expect_refused(bad, "rank 2 is not in");
  // A gather along no axis of a unit that needs one (found by the fuzzer:
  // describing it read the mesh axis at index -1).
  bad = good;
  for (auto& ins : *bad.mutable_instructions()) {
    if (ins.op() == Instruction::GATHER_PARAMS) {
      ins.clear_axes();
      break;
    }
  }
  expect_refused(bad, "is Shard(0) -> Replicate() on axis \"dp\"");
  bad = good;
  bad.mutable_instructions(3)->set_stage(99);
  expect_refused(bad, "stage out of range");
  bad = good;
  bad.mutable_units(0)->mutable_params(0)->mutable_placements(0)->set_dim(2);
  expect_refused(bad, "Shard(2) is out of range");
  bad = good;
  bad.mutable_units(0)->mutable_params(0)->mutable_compute_placements(0)->set_kind(baton::v1::Placement::SHARD);
  expect_refused(bad, "REDUCE_SCATTER_GRADS(unit 0, stage 0, microbatch 0, axes [dp]) along \"dp\": parameter "
                      "blocks.0.w1.weight is Shard(0) -> Shard(0)");
  bad.mutable_units(0)->mutable_params(0)->mutable_compute_placements(0)->set_dim(1);
  expect_refused(bad, "only Shard(d) -> Replicate is gathered");
  bad = good;
  bad.mutable_units(1)->mutable_params(0)->clear_shape();
  expect_refused(bad, "has 0 dims");
  bad = good;
  bad.set_microbatches(0);
  expect_refused(bad, "microbatches 0");
  bad = good;
  bad.mutable_units(0)->set_resident(true);
  expect_refused(bad, "resident and is never freed");
  bad = good;
  for (auto& i : *bad.mutable_instructions()) {
    if (i.op() == Instruction::LOAD_BATCH) i.set_rows(100);
  }
  expect_refused(bad, "100 rows from row 0 are not within the global batch of 8");
  bad = good;
  for (auto& i : *bad.mutable_instructions()) {
    if (i.op() == Instruction::GATHER_PARAMS) i.set_axes(0, "tp");
  }
  expect_refused(bad, "unknown mesh axis \"tp\"");
  bad = good;
  auto* send = bad.add_instructions();
  send->set_op(Instruction::SEND_ACTIVATION);
  send->add_axes("dp");
  send->set_peer(0);
  expect_refused(bad, "peer 0 is not another rank");
  bad = good;
  bad.mutable_units()->erase(bad.mutable_units()->begin());
  expect_refused(bad, "does not own");
  bad = good;
  bad.mutable_units(0)->mutable_params(0)->mutable_placements(0)->set_kind(baton::v1::Placement::PARTIAL);
  expect_refused(bad, "partial parameters are not supported");
  bad = good;
  bad.mutable_stages(1)->set_unit(-1);
  expect_refused(bad, "it needs the unit of its parameters");
  // Gathers must be waited for, and stages must run with their parameters.
  for (Instruction::Op drop : {Instruction::WAIT_PARAMS, Instruction::GATHER_PARAMS}) {
    bad = good;
    for (int i = 0; i < bad.instructions_size(); ++i) {
      if (bad.instructions(i).op() == drop) {
        bad.mutable_instructions()->erase(bad.mutable_instructions()->begin() + i);
        break;
      }
    }
    expect_refused(bad, drop == Instruction::WAIT_PARAMS ? "runs without unit 0's parameters gathered"
                                                         : "no GATHER_PARAMS of unit 0 to wait for");
  }
  bad = good;  // free the head right before its stage runs
  const int head_stage = good.stages_size() - 1;
  for (int i = 0; i < bad.instructions_size(); ++i) {
    if (bad.instructions(i).op() == Instruction::FORWARD && bad.instructions(i).stage() == head_stage) {
      Instruction free;
      free.set_op(Instruction::FREE_PARAMS);
      free.set_unit(good.stages(head_stage).unit());
      bad.mutable_instructions()->Add(std::move(free));
      std::rotate(bad.mutable_instructions()->begin() + i, bad.mutable_instructions()->end() - 1,
                  bad.mutable_instructions()->end());
      break;
    }
  }
  expect_refused(bad, "FORWARD(unit 0, stage 5, microbatch 0) runs without unit 4's parameters gathered");
  bad = good;  // a gather never waited for
  auto* dangling = bad.add_instructions();
  dangling->set_op(Instruction::GATHER_PARAMS);
  dangling->set_unit(0);
  dangling->add_axes("dp");
  expect_refused(bad, "unit 0 is gathered but never waited for");
}

// Tensor-parallel Programs pass the worker's check; ones whose layouts break
// what the stages assume are refused with the reason.
TEST(PlannerTest, TensorParallelProgramsAreCheckedAgainstWhatStagesAssume) {
  auto programs = CompilePrograms(
      Decoder(R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
              R"pb(mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true loss_parallel: true })pb"),
      "j");
  ASSERT_TRUE(programs.ok()) << programs.status();
  for (const auto& p : *programs) EXPECT_TRUE(ValidateProgram(p).ok()) << ValidateProgram(p);
  const auto& good = (*programs)[1];
  auto param = [](baton::v1::Program* p, const std::string& name) -> baton::v1::ParamLayout* {
    for (auto& u : *p->mutable_units()) {
      for (auto& q : *u.mutable_params()) {
        if (q.name() == name) return &q;
      }
    }
    return nullptr;
  };
  auto refused = [](const baton::v1::Program& bad, const std::string& why) {
    const absl::Status s = ValidateProgram(bad);
    std::printf("refused: %s\n", s.ToString().c_str());
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  };
  auto whole = [&](baton::v1::Program* p, const std::string& name) {
    for (auto* placements : {param(p, name)->mutable_placements(), param(p, name)->mutable_compute_placements()}) {
      placements->Mutable(1)->set_kind(baton::v1::Placement::REPLICATE);
    }
  };
  auto bad = good;
  whole(&bad, "layers.0.attention.wk.weight");
  refused(bad, "layers.0.attention: its weights are neither all whole nor split column- then row-wise");
  bad = good;
  for (const char* m : {"wq", "wk", "wv", "wo"}) whole(&bad, std::string("layers.0.attention.") + m + ".weight");
  refused(bad, "sequence parallelism needs every region the residual stream enters split; layers.0.attention is whole");
  bad = good;
  param(&bad, "layers.1.attention.wq.weight")->add_grad_partial_axes("tp");
  refused(bad, "only a replicated weight has partial gradients to sum there");
  bad = good;
  bad.mutable_model()->mutable_decoder()->set_seq_len(9);
  refused(bad, "the 9 positions of a row here do not split over 2");
}

TEST(PlannerTest, TheoryMatchesTheFsdpFormulas) {
  auto job = SeedLab();
  auto t = ComputeTheory(job);
  ASSERT_TRUE(t.ok()) << t.status();
  const ModelLayout layout = BuildModelLayout(job.model());
  const double head = layout.units.back().numel(), last = layout.units[layout.units.size() - 2].numel();
  const double blocks = layout.parameters() - head - last;
  // 3 P (N-1)/N for resharded units, 2 P (N-1)/N for the head and the last
  // block, which do not reshard; fp32, N = 2; plus the metrics all-reduce
  // (two doubles).
  EXPECT_EQ(t->ideal_comm_bytes, (3 * blocks + 2 * (head + last)) * 0.5 * 4 + 16);
  // Padding: the (1, 32) head weight and (1,) bias are padded to one row on
  // rank 1: 33 elements per gather and reduce-scatter more than unpadded.
  EXPECT_EQ(t->comm_bytes, static_cast<int64_t>(t->ideal_comm_bytes) + 2 * (33 - 16.5) * 4);
  // Rank 0 holds the head: the most state.
  EXPECT_EQ(t->state_bytes, 16 * ((layout.parameters() - head) / 2 + head));
  auto ddp = ComputeTheory(SeedLab("mode: DDP"));
  EXPECT_EQ(ddp->ideal_comm_bytes, 2.0 * layout.parameters() * 0.5 * 4 + 16);
  EXPECT_EQ(ddp->state_bytes, 16 * layout.parameters());
  EXPECT_EQ(ddp->peak_unsharded_param_bytes, 4 * layout.parameters());
}

// A group whose ranks share a host holds, per rank, a control page and two
// halves the size of its largest operation's input (at least 64 KiB, at
// most 64 MiB, page-rounded): worker/comm/gloo's segments, counted by hand.
int64_t Segment(int64_t largest_input) {
  const int64_t pages = (largest_input + 4095) / 4096 * 4096;
  return 4096 + 2 * std::min<int64_t>(64 << 20, std::max<int64_t>(64 << 10, pages));
}

TEST(PlannerTest, SharedMemoryIsEachGroupsLargestOperationTwice) {
  const int64_t world_only = Segment(16);  // the metrics' two doubles
  // DDP, a bucket per unit: the dp group's largest all-reduce is the largest
  // unit's fp32 gradients (a block's two 256 x 256 linears and biases).
  const auto mlp = [](const std::string& plan) {
    auto job = ParseJobSpec(R"pb(model { mlp { d_model: 256 blocks: 4 } } mesh { name: "dp" size: 2 }
                                 plan { )pb" + plan + R"pb( } optimizer { lr: 0.01 } data { batch_size: 8 } steps: 1)pb",
                            false);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  };
  const ModelLayout layout = BuildModelLayout(mlp("mode: DDP").model());
  int64_t block = 0;
  for (const auto& unit : layout.units) block = std::max<int64_t>(block, 4 * unit.numel());
  EXPECT_EQ(block, 4 * 2 * (256 * 256 + 256));
  auto ddp = ComputeTheory(mlp("mode: DDP bucket_bytes: 1"));
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  std::printf("DDP per-unit buckets: %lld bytes of segments per rank\n", (long long)ddp->shared_memory_bytes);
  EXPECT_EQ(ddp->shared_memory_bytes, world_only + Segment(block));
  // 25 MiB buckets (the first stops past 1 MiB): more than one unit at once.
  auto one_bucket = ComputeTheory(mlp("mode: DDP"));
  ASSERT_TRUE(one_bucket.ok()) << one_bucket.status();
  EXPECT_GE(one_bucket->shared_memory_bytes, world_only + Segment(2 * block));
  EXPECT_LE(one_bucket->shared_memory_bytes, world_only + Segment(4 * layout.parameters()));
  // FSDP: a reduce-scatter hands in the unit's whole gradients (its blocks
  // of both ranks), a gather its own block.
  auto fsdp = ComputeTheory(mlp("mode: FSDP"));
  ASSERT_TRUE(fsdp.ok()) << fsdp.status();
  EXPECT_EQ(fsdp->shared_memory_bytes, world_only + Segment(block));
  // Tensor parallelism: the attention's and the MLP's outputs are all-reduced
  // whole in fp32: rows x seq x dim x 4 bytes = 8 x 64 x 512 x 4.
  auto wide = Decoder(R"pb(mesh { name: "tp" size: 2 })pb", R"pb(mode: FSDP tensor_parallel { axis: "tp" })pb");
  wide.mutable_model()->mutable_decoder()->set_dim(512);
  wide.mutable_model()->mutable_decoder()->set_seq_len(64);
  auto tp_wide = ComputeTheory(wide);
  ASSERT_TRUE(tp_wide.ok()) << tp_wide.status();
  std::printf("TP dim 512: %lld bytes of segments per rank\n", (long long)tp_wide->shared_memory_bytes);
  EXPECT_EQ(tp_wide->ranks[0].shared_memory, world_only + Segment(8 * 64 * 512 * 4));
  // One rank: no group, no segment.
  auto single = ComputeTheory(Decoder(R"pb(mesh { name: "dp" size: 1 })pb", "mode: FSDP"));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->shared_memory_bytes, 0);
}

}  // namespace
}  // namespace baton
