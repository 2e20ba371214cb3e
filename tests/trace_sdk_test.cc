// The SDK's Job::Trace on an attached job (issue 49): the script arms the
// trace, runs the steps itself and gets them back recorded - one slice per
// Program instruction per rank per step, on one clock - and tracing changes
// nothing of the steps: the traced job's losses and gradient norms equal an
// untraced run's bit for bit. Then every other kind of plan traced the same
// way (DDP, HSDP, ZeRO-2, an interleaved pipeline, context x tensor
// parallelism, pipeline x context parallelism): its slices count its
// instructions, and every slice's bytes are the plan's.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/job.h"
#include "strategies/dry_run.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

constexpr char kJob[] = R"pb(
  name: "traced"
  model { decoder { vocab: 256 dim: 64 layers: 2 heads: 4 ffn_dim: 256 seq_len: 32 } }
  mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 }
  plan { mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true } }
  optimizer { lr: 0.003 max_grad_norm: 1.0 }
  data { batch_size: 8 }
  steps: 12
)pb";

// The trace's instruction slices per (rank, step), checked against the
// Programs; and its slices whose measured bytes differ from the plan's.
struct TraceCounts {
  std::map<std::pair<int, int>, int> slices;
  int64_t events = 0, with_bytes = 0, mismatched = 0;
};
TraceCounts Count(const std::string& json) {
  TraceCounts c;
  const nlohmann::json doc = nlohmann::json::parse(json);
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++c.events;
    if (e["cat"] == "io") continue;
    if (e["cat"] == "instruction") ++c.slices[{e["pid"].get<int>(), e["args"]["step"].get<int>()}];
    const int64_t bytes = e["args"]["bytes"].get<int64_t>(), plan = e["args"]["plan_bytes"].get<int64_t>();
    c.with_bytes += plan > 0;
    if (bytes != plan) {
      ++c.mismatched;
      ADD_FAILURE() << "rank " << e["pid"] << " " << e["args"]["detail"] << ": " << bytes << " B, the plan " << plan;
    }
  }
  return c;
}

TEST(TraceSdkTest, AnAttachedJobTracesItsOwnStepsAndTheyAreTheSameSteps) {
  auto spec = ParseJobSpec(kJob, false);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = PlanJob(*spec, "j");
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto cluster = testing::StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());

  std::vector<baton::v1::StepMetrics> untraced, traced;
  {
    auto job = Job::Create(client->get(), *spec);
    ASSERT_TRUE(job.ok()) << job.status();
    auto m = (*job)->Step(10);
    ASSERT_TRUE(m.ok()) << m.status();
    untraced = *m;
  }
  auto job = Job::Create(client->get(), *spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(3).ok());
  auto trace = (*job)->Trace(4);
  ASSERT_TRUE(trace.ok()) << trace.status();
  std::printf("traced steps %d-%d: %lld slices, clock bound %.1f us\n", trace->first_step(), trace->last_step(),
              static_cast<long long>(trace->slices()), trace->clock_bound_us());
  EXPECT_EQ(trace->first_step(), 4);
  EXPECT_EQ(trace->last_step(), 7);
  ASSERT_TRUE((*job)->Step(3).ok());
  traced = (*job)->metrics();
  ASSERT_EQ(traced.size(), 10u);
  for (size_t i = 0; i < traced.size(); ++i) {
    const double a[2] = {untraced[i].loss(), untraced[i].grad_norm()}, b[2] = {traced[i].loss(), traced[i].grad_norm()};
    EXPECT_EQ(std::memcmp(a, b, sizeof(a)), 0) << "step " << i + 1 << ": loss " << a[0] << " vs " << b[0];
  }
  std::printf("10 steps, 4 of them traced: losses and grad norms bit-identical to an untraced run (last loss %.9f)\n",
              traced.back().loss());

  // The file: one instruction slice per Program instruction per rank per step.
  TraceCounts counts = Count(trace->trace_json());
  auto& slices = counts.slices;
  EXPECT_EQ(counts.events, trace->slices());
  EXPECT_EQ(counts.mismatched, 0);
  for (int r = 0; r < 4; ++r) {
    const int n = plan->programs[r].instructions_size();
    for (int s = 4; s <= 7; ++s) EXPECT_EQ((slices[{r, s}]), n) << "rank " << r << " step " << s;
    std::printf("rank %d: %d instruction slices per step (its Program has %d)\n", r, slices[{r, 4}], n);
  }
  EXPECT_EQ(slices.size(), 16u);
  ASSERT_EQ(trace->clocks_size(), 4);
  for (const auto& c : trace->clocks()) EXPECT_LE(std::abs(c.offset_us()), c.bound_us()) << c.worker();
  testing::StopAndExpectAllGone(*cluster);
}

TEST(TraceSdkTest, EveryKindOfPlanTracesToItsInstructionsAndItsBytes) {
  const char* kExamples[] = {
      "examples/decoder_ddp.textproto",      "examples/decoder_hsdp.textproto",
      "examples/decoder_zero2.textproto",    "examples/decoder_pp4_interleaved.textproto",
      "examples/llama_cp2_tp2.textproto",    "examples/llama_pp2_cp2.textproto",
  };
  auto cluster = testing::StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  for (const char* example : kExamples) {
    auto spec = ParseJobSpec(testing::ReadFile(testing::Runfile(example)), false);
    ASSERT_TRUE(spec.ok()) << example << ": " << spec.status();
    spec->set_steps(6);
    auto plan = PlanJob(*spec, "j");
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto job = Job::Create(client->get(), *spec);
    ASSERT_TRUE(job.ok()) << example << ": " << job.status();
    ASSERT_TRUE((*job)->Step(1).ok());
    auto trace = (*job)->Trace(3);
    ASSERT_TRUE(trace.ok()) << example << ": " << trace.status();
    const TraceCounts counts = Count(trace->trace_json());
    const int ranks = static_cast<int>(plan->programs.size());
    int wrong = 0;
    for (int r = 0; r < ranks; ++r) {
      for (int s = trace->first_step(); s <= trace->last_step(); ++s) {
        const auto it = counts.slices.find({r, s});
        wrong += it == counts.slices.end() || it->second != plan->programs[r].instructions_size();
      }
    }
    std::printf("%-44s %d ranks, steps %d-%d: %lld slices, %lld move bytes (all equal to the plan's: %s), "
                "instruction slices per rank and step as its Program: %s, clock bound %.1f us\n",
                example, ranks, trace->first_step(), trace->last_step(), static_cast<long long>(counts.events),
                static_cast<long long>(counts.with_bytes), counts.mismatched == 0 ? "yes" : "NO",
                wrong == 0 ? "yes" : "NO", trace->clock_bound_us());
    EXPECT_EQ(trace->last_step() - trace->first_step() + 1, 3) << example;
    EXPECT_EQ(wrong, 0) << example;
    EXPECT_EQ(static_cast<int>(counts.slices.size()), ranks * 3) << example;
    EXPECT_GT(counts.with_bytes, 0) << example;
  }
  testing::StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
