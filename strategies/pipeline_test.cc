// The pipeline planner without running anything: which plans are refused
// and why, what every schedule's order holds to for many (p, v, m), and
// that compiled Programs pair every send with its receive, in order.
#include "strategies/pipeline.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "program/program_check.h"
#include "strategies/dry_run.h"
#include "strategies/job_spec.h"
#include "models/model.h"
#include "strategies/planner.h"

namespace baton {
namespace {

using baton::v1::Instruction;

// A decoder of `layers` blocks over a mesh with a `pp` axis of `p` ranks.
std::string Job(int layers, int p, const std::string& pipeline, int microbatches, const std::string& extra = "") {
  return absl::StrCat("model { decoder { vocab: 32 dim: 16 layers: ", layers,
                      " heads: 2 ffn_dim: 24 seq_len: 4 } } mesh { name: \"pp\" size: ", p,
                      " } mesh { name: \"tp\" size: 2 } plan { mode: FSDP pipeline_parallel { axis: \"pp\" ", pipeline,
                      " } ", extra, " } optimizer { lr: 0.01 } data { batch_size: 24 microbatches: ", microbatches,
                      " } steps: 1");
}

TEST(PipelinePlanTest, BadPlansAreRefusedWithTheReason) {
  const struct {
    std::string job, expect;
  } cases[] = {
      {Job(3, 4, "schedule: GPIPE", 2), "more stages than blocks: 4 ranks x 1 chunks = 4 chunks for 3 blocks"},
      {Job(5, 3, "schedule: INTERLEAVED_1F1B", 3), "6 chunks for 5 blocks"},
      {Job(4, 2, "schedule: ONE_F_ONE_B", 0), "data.microbatches must be >= 1, got 0"},
      {Job(4, 2, "schedule: INTERLEAVED_1F1B", 3), "needs data.microbatches (3) to be a multiple of the 2"},
      {Job(4, 1, "schedule: INTERLEAVED_1F1B", 2), "INTERLEAVED_1F1B needs at least 2 ranks along \"pp\", got 1"},
      {Job(4, 2, "schedule: INTERLEAVED_1F1B virtual_stages: 1", 2), "needs at least 2 chunks per rank"},
      {Job(4, 2, "schedule: GPIPE virtual_stages: 2", 2), "only INTERLEAVED_1F1B puts more than one chunk"},
      {Job(4, 2, "schedule: GPIPE split: [4, 0]", 2), "split leaves chunk 1 without a block"},
      {Job(4, 2, "schedule: GPIPE split: [1, 1]", 2), "summing to the model's 4"},
      {Job(4, 2, "schedule: GPIPE split: [1, 1, 2]", 2), "each of the 2 chunks"},
      {Job(4, 2, "schedule: GPIPE", 2, "tensor_parallel { axis: \"pp\" }"), "also the tensor-parallel axis"},
      {absl::StrReplaceAll(Job(4, 2, "schedule: GPIPE", 2), {{"axis: \"pp\" schedule", "axis: \"xx\" schedule"}}),
       "plan.pipeline_parallel.axis \"xx\" is not an axis of the mesh (pp=2,tp=2)"},
  };
  for (const auto& c : cases) {
    auto job = ParseJobSpec(c.job, false);
    absl::Status s = job.ok() ? ValidateJobSpec(*job) : job.status();
    std::printf("refused: %s\n", s.ToString().c_str());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.job;
    EXPECT_TRUE(absl::StrContains(s.message(), c.expect)) << s << "\nwanted: " << c.expect;
  }
}

// Every rank runs the forward and the backward of each of its chunks for
// each microbatch exactly once, forward first; the timeline never deadlocks;
// its bubble is the formula's; GPipe holds m microbatches on the first
// stage, 1F1B p - r on rank r (at most m).
TEST(PipelinePlanTest, EveryScheduleRunsEachPassOnceAndMatchesTheFormula) {
  int plans = 0;
  for (const char* schedule : {"GPIPE", "ONE_F_ONE_B", "INTERLEAVED_1F1B"}) {
    const bool interleaved = std::string(schedule) == "INTERLEAVED_1F1B";
    for (int p : {2, 3, 4, 5}) {
      for (int v : interleaved ? std::vector<int>{2, 3} : std::vector<int>{1}) {
        for (int m = 1; m <= 12; ++m) {
          if (interleaved && m % p != 0) continue;
          const std::string text = Job(p * v + 1, p,
                                       absl::StrCat("schedule: ", schedule,
                                                    interleaved ? absl::StrCat(" virtual_stages: ", v) : ""),
                                       m);
          auto job = ParseJobSpec(absl::StrReplaceAll(text, {{"batch_size: 24", absl::StrCat("batch_size: ", 2 * m)}}),
                                  false);
          ASSERT_TRUE(job.ok()) << job.status();
          ASSERT_TRUE(ValidateJobSpec(*job).ok()) << ValidateJobSpec(*job);
          auto plan = PlanPipeline(*job, BuildModelLayout(job->model()));
          ASSERT_TRUE(plan.ok()) << plan.status();
          for (int r = 0; r < p; ++r) {
            std::map<std::tuple<int, int, int>, int> seen;  // (kind, chunk, mb) -> count
            for (const ChunkPass& pass : PipelineOrder(*plan, r, m)) {
              ASSERT_EQ(plan->RankOf(pass.chunk), r);
              if (pass.kind == Pass::kBackward) {
                EXPECT_EQ((seen[{Pass::kForward, pass.chunk, pass.microbatch}]), 1) << "backward before forward";
              }
              ++seen[{pass.kind, pass.chunk, pass.microbatch}];
            }
            EXPECT_EQ(seen.size(), static_cast<size_t>(2 * v * m)) << schedule << " p=" << p << " m=" << m;
            for (const auto& [key, count] : seen) EXPECT_EQ(count, 1);
          }
          // Compiled, every Program passes the worker's check and every
          // channel pairs its sends and receives (or compiling fails).
          auto dry = PlanDryRun(*job);
          ASSERT_TRUE(dry.ok()) << schedule << " p=" << p << " v=" << v << " m=" << m << ": " << dry.status();
          auto t = SimulatePipeline(*plan, m);
          ASSERT_TRUE(t.ok()) << schedule << " p=" << p << " v=" << v << " m=" << m << ": " << t.status();
          for (double idle : t->idle_fraction) EXPECT_NEAR(idle, BubbleFraction(p, v, m), 1e-12);
          if (!interleaved) {
            for (int r = 0; r < p; ++r) {
              EXPECT_EQ(t->peak_live[r], std::string(schedule) == "GPIPE" ? m : std::min(p - r, m))
                  << schedule << " p=" << p << " m=" << m << " rank " << r;
            }
          }
          ++plans;
        }
      }
    }
  }
  std::printf("%d plans: every pass once, compiled and checked, no deadlock, bubble = (p-1)/(v m+p-1) on every rank\n",
              plans);
}

// Compiled Programs: every (sender, receiver) channel carries its messages
// in the order they are received, shapes equal - also where activations and
// gradients share a direction (two ranks, interleaved) - and every Program
// passes the worker's own check.
TEST(PipelinePlanTest, EveryChannelMatchesInOrder) {
  for (const std::string& text :
       {Job(6, 2, "schedule: INTERLEAVED_1F1B virtual_stages: 3", 4), Job(4, 2, "schedule: INTERLEAVED_1F1B", 6),
        Job(5, 3, "schedule: ONE_F_ONE_B split: [2, 1, 2]", 6, "tensor_parallel { axis: \"tp\" sequence_parallel: true }"),
        Job(8, 4, "schedule: INTERLEAVED_1F1B", 4)}) {
    auto job = ParseJobSpec(text, false);
    ASSERT_TRUE(job.ok()) << job.status();
    auto plan = PlanDryRun(*job);
    ASSERT_TRUE(plan.ok()) << plan.status();
    using Message = std::tuple<int, int, int, std::vector<int64_t>>;  // (op, boundary, mb, shape)
    std::map<std::pair<int, int>, std::vector<Message>> sent, received;
    bool shared_direction = false;
    for (const auto& p : plan->programs) {
      std::map<int, std::set<int>> kinds;  // peer -> send ops
      for (const Instruction& i : p.instructions()) {
        const std::vector<int64_t> shape(i.shape().begin(), i.shape().end());
        if (i.op() == Instruction::SEND_ACTIVATION || i.op() == Instruction::SEND_GRAD) {
          const bool grad = i.op() == Instruction::SEND_GRAD;
          sent[{p.rank(), i.peer()}].push_back({grad, grad ? i.stage() - 1 : i.stage(), i.microbatch(), shape});
          kinds[i.peer()].insert(i.op());
        }
        if (i.op() == Instruction::RECV_ACTIVATION || i.op() == Instruction::RECV_GRAD) {
          const bool grad = i.op() == Instruction::RECV_GRAD;
          received[{i.peer(), p.rank()}].push_back({grad, grad ? i.stage() : i.stage() - 1, i.microbatch(), shape});
        }
      }
      for (const auto& [peer, ops] : kinds) shared_direction |= ops.size() > 1;
    }
    EXPECT_EQ(sent, received) << text;
    size_t messages = 0;
    for (const auto& [pair, list] : sent) messages += list.size();
    std::printf("%zu messages on %zu channels, each received in the order sent%s\n", messages, sent.size(),
                shared_direction ? " (activations and gradients sharing a direction)" : "");
  }
}

}  // namespace
}  // namespace baton
