// One rank's step as the planner writes it (strategies/step_writer.h): every
// stage runs with its unit gathered, gathers prefetched as far as asked and
// freed when done, gradients reduced once per step in the data-parallel
// mode's way.
#include "strategies/step_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "program/wire.h"
#include "mesh/layout.h"
#include "strategies/planner.h"
#include "strategies/testing/plan_jobs.h"

namespace baton {
namespace {

using baton::v1::Instruction;
using testing::Decoder;
using testing::SeedLab;
using testing::UnitIndex;

// Replays a program's gather/free instructions and checks that every stage
// runs with its unit gathered, and how many units are gathered at most.
struct Replay {
  int max_gathered_blocks = 0;  // non-root units gathered or in flight at once
  std::map<int, int> gathers;   // unit -> GATHER_PARAMS count
  std::map<int, int> reduce_scatters;
  std::map<Instruction::Op, int> ops;
};

Replay ReplayProgram(const baton::v1::Program& p, const std::set<int>& roots) {
  Replay r;
  std::set<int> ready, in_flight;
  for (const auto& u : p.units()) {
    if (u.resident()) ready.insert(u.index());
  }
  for (const auto& i : p.instructions()) {
    r.ops[i.op()]++;
    switch (i.op()) {
      case Instruction::GATHER_PARAMS:
        EXPECT_FALSE(in_flight.count(i.unit())) << "double gather";
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
      case Instruction::BACKWARD: {
        const int unit = p.stages(i.stage()).unit();
        EXPECT_TRUE(unit < 0 || ready.count(unit)) << "stage " << i.stage() << " runs without its parameters";
        break;
      }
      case Instruction::REDUCE_SCATTER_GRADS:
        r.reduce_scatters[i.unit()]++;
        break;
      default:
        break;
    }
    int blocks = 0;
    for (int u : ready) blocks += !roots.count(u);
    for (int u : in_flight) blocks += !roots.count(u);
    r.max_gathered_blocks = std::max(r.max_gathered_blocks, blocks);
  }
  bool resident = false;
  for (const auto& u : p.units()) resident |= u.resident();
  if (!resident) {
    EXPECT_TRUE(ready.empty() && in_flight.empty()) << "parameters left gathered after the step";
  }
  return r;
}

TEST(PlannerTest, FsdpGathersBlocksTwiceRootsOnceAndPrefetchesOneAhead) {
  auto programs = CompilePrograms(SeedLab(), "job-1");
  ASSERT_TRUE(programs.ok());
  const auto& p = (*programs)[0];
  const int head = UnitIndex(p, "head");
  Replay r = ReplayProgram(p, {head});
  EXPECT_EQ(r.gathers[head], 1);  // the head keeps its parameters through backward
  for (int b = 0; b < 4; ++b) {
    const int u = UnitIndex(p, "blocks." + std::to_string(b));
    // Forward and again for backward; the last block keeps its parameters
    // (backward needs it first).
    EXPECT_EQ(r.gathers[u], b == 3 ? 1 : 2) << "unit " << u;
    EXPECT_EQ(r.reduce_scatters[u], 1);
  }
  EXPECT_EQ(r.reduce_scatters[head], 1);
  EXPECT_EQ(r.ops[Instruction::FREE_GRADS], 5);
  std::printf("most blocks gathered at once: %d\n", r.max_gathered_blocks);
  EXPECT_EQ(r.max_gathered_blocks, 2);  // the one computing and the one prefetched
}

TEST(PlannerTest, ReshardLastBlockOnRequest) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP reshard_last_block: true"), "job-1");
  ASSERT_TRUE(programs.ok());
  EXPECT_EQ(ReplayProgram((*programs)[0], {}).gathers[UnitIndex((*programs)[0], "blocks.3")], 2);
}

TEST(PlannerTest, WithoutPrefetchOneBlockAtATime) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP prefetch: false"), "job-1");
  ASSERT_TRUE(programs.ok());
  EXPECT_EQ(ReplayProgram((*programs)[1], {UnitIndex((*programs)[1], "head")}).max_gathered_blocks, 1);
}

TEST(PlannerTest, AccumulationReducesOnlyOnTheLastMicrobatch) {
  auto programs = CompilePrograms(SeedLab("mode: FSDP", 2), "job-1");
  ASSERT_TRUE(programs.ok());
  const auto& p = (*programs)[0];
  Replay r = ReplayProgram(p, {});
  for (const auto& u : p.units()) EXPECT_EQ(r.reduce_scatters[u.index()], 1);
  EXPECT_EQ(r.gathers[UnitIndex(p, "blocks.0")], 4);
  EXPECT_EQ(r.gathers[UnitIndex(p, "blocks.3")], 2);  // the last block: once per microbatch
  // Each microbatch loads its own rows: rank 0 holds rows [0, 4) of 8.
  std::vector<std::pair<int64_t, int64_t>> loads;
  for (const auto& i : p.instructions()) {
    if (i.op() == Instruction::LOAD_BATCH) loads.push_back({i.row_offset(), i.rows()});
  }
  EXPECT_EQ(loads, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 2}}));
  const auto& other = (*programs)[1];
  for (const auto& i : other.instructions()) {
    if (i.op() == Instruction::LOAD_BATCH) {
      EXPECT_GE(i.row_offset(), 4);
    }
  }
}

TEST(PlannerTest, ReplicatedModesKeepResidentUnits) {
  for (const char* plan : {"mode: DDP", "mode: ZERO1", "mode: ZERO2"}) {
    auto programs = CompilePrograms(SeedLab(plan), "job-1");
    ASSERT_TRUE(programs.ok());
    const auto& p = (*programs)[0];
    Replay r = ReplayProgram(p, {});
    for (const auto& u : p.units()) EXPECT_TRUE(u.resident()) << plan;
    EXPECT_EQ(r.ops[Instruction::FREE_PARAMS], 0) << plan;
    if (std::string(plan) == "mode: DDP") {
      // One bucket: the five units' gradients are far under 25 MiB.
      EXPECT_EQ(r.ops[Instruction::ALL_REDUCE_GRADS], 1);
      EXPECT_EQ(r.ops[Instruction::WAIT_GRADS], 1);
      EXPECT_EQ(r.ops[Instruction::GATHER_PARAMS], 0);
    } else {
      EXPECT_EQ(r.ops[Instruction::REDUCE_SCATTER_GRADS], 5) << plan;
      // Updated parameters gathered once, after the optimizer step.
      EXPECT_EQ(r.ops[Instruction::GATHER_PARAMS], 5) << plan;
      EXPECT_EQ(p.instructions(p.instructions_size() - 1).op(), Instruction::WAIT_PARAMS);
      // ZeRO-1 keeps the full gradients, ZeRO-2 drops them once reduced.
      EXPECT_EQ(r.ops[Instruction::FREE_GRADS], std::string(plan) == "mode: ZERO1" ? 0 : 5) << plan;
    }
  }
}

TEST(PlannerTest, HsdpShardsAlongTheLastAxisAndReducesAcrossReplicas) {
  auto programs = CompilePrograms(
      Decoder(R"pb(mesh { name: "replicate" size: 2 } mesh { name: "shard" size: 2 })pb", "mode: HSDP"), "j");
  ASSERT_TRUE(programs.ok());
  ASSERT_EQ(programs->size(), 4u);
  int all_reduce = 0;
  for (const auto& i : (*programs)[0].instructions()) {
    if (i.op() == Instruction::ALL_REDUCE_GRADS) {
      EXPECT_EQ(std::vector<std::string>(i.axes().begin(), i.axes().end()), std::vector<std::string>{"replicate"});
      ++all_reduce;
    }
    if (i.op() == Instruction::GATHER_PARAMS || i.op() == Instruction::REDUCE_SCATTER_GRADS) {
      EXPECT_EQ(std::vector<std::string>(i.axes().begin(), i.axes().end()), std::vector<std::string>{"shard"});
    }
    if (i.op() == Instruction::REDUCE_METRICS) {
      EXPECT_EQ(i.axes_size(), 2);
    }
  }
  EXPECT_EQ(all_reduce, 4);  // embedding, two layers, head
  // Ranks 2 and 3 hold the same pieces as 0 and 1: rows follow the shard axis.
  auto mesh = ToDeviceMesh((*programs)[0].mesh());
  const auto& emb = (*programs)[3].units(0).params(0);
  EXPECT_EQ(LocalPiece(*StorageLayout(emb, *mesh), *mesh, 3)->ToString(), "[32:64, 0:32]");
  EXPECT_EQ(LocalPiece(*StorageLayout(emb, *mesh), *mesh, 1)->ToString(), "[32:64, 0:32]");
}

}  // namespace
}  // namespace baton
