// Where the planner puts gradient reductions and their waits
// (strategies/grad_reductions.h), and gather prefetch depth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "program/program_check.h"
#include "strategies/job_spec.h"
#include "strategies/plan_theory.h"
#include "strategies/planner.h"

namespace baton {
namespace {

using baton::v1::Instruction;

std::vector<baton::v1::Program> Compile(const std::string& mesh, const std::string& plan, int layers = 4) {
  auto job = ParseJobSpec(R"pb(
    model { decoder { vocab: 64 dim: 32 layers: )pb" + std::to_string(layers) + R"pb( heads: 2 ffn_dim: 64 seq_len: 8 } }
    )pb" + mesh + R"pb( plan { )pb" + plan + R"pb( } optimizer { lr: 0.01 } data { batch_size: 8 } steps: 1
  )pb",
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, "j");
  EXPECT_TRUE(programs.ok()) << programs.status();
  return programs.ok() ? *programs : std::vector<baton::v1::Program>{};
}

// Replays a step's reductions: none issued for a unit with one in flight,
// every wait for one in flight, none left at the metrics. Returns, per
// reduction, how many BACKWARD passes ran between its issue and its wait.
std::vector<int> ReplayReductions(const baton::v1::Program& p) {
  std::map<int, std::vector<int>> in_flight;  // first unit -> bucket
  std::map<int, int> issued_at;                // first unit -> backwards so far
  std::vector<int> hidden_behind;
  int backwards = 0;
  for (const Instruction& i : p.instructions()) {
    switch (i.op()) {
      case Instruction::BACKWARD:
        ++backwards;
        break;
      case Instruction::REDUCE_SCATTER_GRADS:
      case Instruction::ALL_REDUCE_GRADS: {
        std::vector<int> bucket = {i.unit()};
        bucket.insert(bucket.end(), i.bucket().begin(), i.bucket().end());
        for (const auto& [first, units] : in_flight) {
          for (int u : bucket) {
            EXPECT_EQ(std::count(units.begin(), units.end(), u), 0) << "unit " << u << " reduced twice at once";
          }
        }
        in_flight[i.unit()] = bucket;
        issued_at[i.unit()] = backwards;
        break;
      }
      case Instruction::WAIT_GRADS:
        EXPECT_EQ(in_flight.erase(i.unit()), 1u) << "WAIT_GRADS of unit " << i.unit() << " with nothing in flight";
        hidden_behind.push_back(backwards - issued_at[i.unit()]);
        break;
      case Instruction::REDUCE_METRICS:
      case Instruction::CLIP_GRAD_NORM:
      case Instruction::OPTIMIZER_STEP:
        EXPECT_TRUE(in_flight.empty()) << Instruction::Op_Name(i.op()) << " with a reduction in flight";
        break;
      default:
        break;
    }
  }
  EXPECT_TRUE(in_flight.empty());
  return hidden_behind;
}

std::map<Instruction::Op, int> Count(const baton::v1::Program& p) {
  std::map<Instruction::Op, int> n;
  for (const Instruction& i : p.instructions()) n[i.op()]++;
  return n;
}

TEST(GradReductionsTest, OverlapWaitsForEachReductionWhenTheNextUnitsIsIssued) {
  for (const char* mode : {"FSDP", "HSDP"}) {
    const std::string mesh = std::string(mode) == "HSDP" ? R"pb(mesh { name: "r" size: 2 } mesh { name: "s" size: 2 })pb"
                                                         : R"pb(mesh { name: "dp" size: 2 })pb";
    for (bool overlap : {true, false}) {
      auto programs = Compile(mesh, absl::StrCat("mode: ", mode, overlap ? "" : " overlap_grad_reduce: false"));
      ASSERT_FALSE(programs.empty());
      for (const auto& p : programs) {
        const std::vector<int> hidden = ReplayReductions(p);
        const auto n = Count(p);
        // Embedding, 4 blocks, head: a reduce-scatter each, HSDP an all-reduce after each.
        EXPECT_EQ(n.at(Instruction::REDUCE_SCATTER_GRADS), 6);
        EXPECT_EQ(n.count(Instruction::ALL_REDUCE_GRADS) ? n.at(Instruction::ALL_REDUCE_GRADS) : 0,
                  std::string(mode) == "HSDP" ? 6 : 0);
        EXPECT_EQ(n.at(Instruction::WAIT_GRADS), std::string(mode) == "HSDP" ? 12 : 6);
        int behind_backward = 0;
        for (int h : hidden) behind_backward += h > 0;
        if (p.rank() == 0) {
          std::printf("%s overlap=%d: %zu reductions, %d of them run while a backward computes\n", mode, overlap,
                      hidden.size(), behind_backward);
        }
        if (overlap) {
          // Every reduce-scatter but the last unit's runs behind the next backward.
          EXPECT_GE(behind_backward, 5) << mode;
        } else {
          EXPECT_EQ(behind_backward, 0) << mode;
        }
      }
    }
  }
}

TEST(GradReductionsTest, DdpBucketsUnitsUpToBucketBytes) {
  struct Case {
    int64_t bucket_bytes;
    int all_reduces;  // 0: more than one, fewer than one per unit
  };
  int64_t comm = -1;
  for (const Case c : {Case{0, 6}, Case{1, 6}, Case{60000, 0}, Case{25 << 20, 1}}) {
    auto programs = Compile(R"pb(mesh { name: "dp" size: 2 })pb",
                            absl::StrCat("mode: DDP bucket_bytes: ", c.bucket_bytes));
    ASSERT_FALSE(programs.empty());
    const auto& p = programs[0];
    ReplayReductions(p);
    std::set<int> reduced;
    int all_reduces = 0;
    for (const Instruction& i : p.instructions()) {
      if (i.op() != Instruction::ALL_REDUCE_GRADS) continue;
      ++all_reduces;
      reduced.insert(i.unit());
      reduced.insert(i.bucket().begin(), i.bucket().end());
    }
    std::printf("DDP bucket_bytes %lld: %d all-reduces over %zu units\n", static_cast<long long>(c.bucket_bytes),
                all_reduces, reduced.size());
    if (c.all_reduces > 0) {
      EXPECT_EQ(all_reduces, c.all_reduces) << c.bucket_bytes;
    } else {
      EXPECT_GT(all_reduces, 1);
      EXPECT_LT(all_reduces, 6);
    }
    EXPECT_EQ(reduced.size(), 6u) << "every unit reduced once";
    // The bytes on the wire do not depend on the buckets.
    auto theory = AnalyzePrograms(programs);
    ASSERT_TRUE(theory.ok()) << theory.status();
    if (comm < 0) comm = theory->ranks[0].comm;
    EXPECT_EQ(theory->ranks[0].comm, comm) << c.bucket_bytes;
  }
}

TEST(GradReductionsTest, TheFirstBucketIsAtMostOneMiBAsDdps) {
  // Blocks of 3 MiB of gradients, a head of 66 KB: the head and the last
  // block (the first past 1 MiB) go first, the other blocks and the
  // embedding in the 25 MiB bucket.
  auto job = ParseJobSpec(R"pb(
    model { decoder { vocab: 64 dim: 256 layers: 4 heads: 4 ffn_dim: 1024 seq_len: 8 } }
    mesh { name: "dp" size: 2 } plan { mode: DDP } optimizer { lr: 0.01 } data { batch_size: 8 } steps: 1
  )pb",
                          false);
  ASSERT_TRUE(job.ok()) << job.status();
  auto programs = CompilePrograms(*job, "j");
  ASSERT_TRUE(programs.ok()) << programs.status();
  std::vector<int> bucket_sizes;
  for (const Instruction& i : (*programs)[0].instructions()) {
    if (i.op() == Instruction::ALL_REDUCE_GRADS) bucket_sizes.push_back(1 + i.bucket_size());
  }
  std::printf("DDP, 4 blocks of 3 MiB: buckets of %d and %d units\n", bucket_sizes.empty() ? 0 : bucket_sizes[0],
              bucket_sizes.size() < 2 ? 0 : bucket_sizes[1]);
  EXPECT_EQ(bucket_sizes, (std::vector<int>{2, 4}));
}

TEST(GradReductionsTest, TheProgramCheckRefusesBrokenReductions) {
  auto fsdp = Compile(R"pb(mesh { name: "dp" size: 2 })pb", "mode: FSDP");
  ASSERT_FALSE(fsdp.empty());
  ASSERT_TRUE(ValidateProgram(fsdp[0]).ok());
  auto drop_first = [](baton::v1::Program p, Instruction::Op op) {
    auto* ins = p.mutable_instructions();
    for (int i = 0; i < ins->size(); ++i) {
      if (ins->Get(i).op() == op) {
        ins->DeleteSubrange(i, 1);
        break;
      }
    }
    return p;
  };
  // A wait with nothing in flight (its reduce-scatter gone).
  const absl::Status no_reduction = ValidateProgram(drop_first(fsdp[0], Instruction::REDUCE_SCATTER_GRADS));
  EXPECT_FALSE(no_reduction.ok());
  std::printf("without its REDUCE_SCATTER_GRADS: %s\n", std::string(no_reduction.message()).c_str());
  // A second reduction of a unit in flight.
  baton::v1::Program twice = fsdp[0];
  for (int i = 0; i < twice.instructions_size(); ++i) {
    if (twice.instructions(i).op() != Instruction::REDUCE_SCATTER_GRADS) continue;
    *twice.mutable_instructions()->Add() = twice.instructions(i);
    twice.mutable_instructions()->SwapElements(i + 1, twice.instructions_size() - 1);
    break;
  }
  EXPECT_FALSE(ValidateProgram(twice).ok());
  // A bucket that names a unit twice.
  auto ddp = Compile(R"pb(mesh { name: "dp" size: 2 })pb", "mode: DDP");
  ASSERT_FALSE(ddp.empty());
  for (auto& ins : *ddp[0].mutable_instructions()) {
    if (ins.op() == Instruction::ALL_REDUCE_GRADS && ins.bucket_size() > 0) ins.add_bucket(ins.bucket(0));
  }
  const absl::Status dup = ValidateProgram(ddp[0]);
  EXPECT_FALSE(dup.ok());
  std::printf("a bucket naming a unit twice: %s\n", std::string(dup.message()).c_str());
}

TEST(GradReductionsTest, PrefetchDepthKeepsThatManyGathersInFlight) {
  for (int depth : {0, 1, 2, 3}) {
    auto programs = Compile(R"pb(mesh { name: "dp" size: 2 })pb", absl::StrCat("mode: FSDP prefetch_depth: ", depth), 6);
    ASSERT_FALSE(programs.empty());
    int in_flight = 0, most = 0;
    for (const Instruction& i : programs[0].instructions()) {
      if (i.op() == Instruction::GATHER_PARAMS) most = std::max(most, ++in_flight);
      if (i.op() == Instruction::WAIT_PARAMS) --in_flight;
    }
    std::printf("prefetch_depth %d: at most %d gathers in flight\n", depth, most);
    EXPECT_EQ(most, depth + 1) << depth;
  }
  auto bad = ParseJobSpec(R"pb(model { mlp { d_model: 8 blocks: 1 } } mesh { name: "dp" size: 1 }
                               plan { mode: FSDP prefetch_depth: -1 } optimizer { lr: 0.1 } data { batch_size: 2 })pb",
                          false);
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace baton
