// How gradient reductions and gathers are scheduled changes when bytes move,
// never what they sum: overlapped and waited-at-once reductions, DDP's
// buckets and a unit per collective (two ranks), and prefetch depths give the same
// losses and gradient norms bit for bit, through the controller, for FSDP,
// HSDP, DDP and FSDP x TP with sequence parallelism (partial-sum
// all-reduces). Each pair also prints its exposed communication.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/job.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"

namespace baton {
namespace {

struct Variant {
  const char* what;
  const char* plan;  // appended to the plan
};

struct Case {
  const char* what;
  const char* mesh;
  const char* plan;
  std::vector<Variant> variants;  // the first is the reference
};

const char* kModel =
    R"pb(model { decoder { vocab: 256 dim: 64 layers: 4 heads: 4 ffn_dim: 256 seq_len: 32 } })pb";

TEST(OverlapTest, SchedulingNeverChangesTheSteps) {
  const std::vector<Case> cases = {
      {"FSDP dp=4", R"pb(mesh { name: "dp" size: 4 })pb", "mode: FSDP",
       {{"overlapped", ""}, {"waited at once", "overlap_grad_reduce: false"}, {"prefetch 0", "prefetch_depth: 0"},
        {"prefetch 3", "prefetch_depth: 3"}}},
      {"HSDP 2x2", R"pb(mesh { name: "r" size: 2 } mesh { name: "s" size: 2 })pb", "mode: HSDP",
       {{"overlapped", ""}, {"waited at once", "overlap_grad_reduce: false"}}},
      {"DDP dp=4", R"pb(mesh { name: "dp" size: 4 })pb", "mode: DDP",
       {{"default buckets", ""}, {"waited at once", "overlap_grad_reduce: false"}}},
      // Buckets move an element to another chunk of the ring all-reduce: with
      // two ranks every sum is a + b either way (at four the three additions
      // may come in another order, a last-bit difference).
      {"DDP dp=2", R"pb(mesh { name: "dp" size: 2 })pb", "mode: DDP",
       {{"default buckets", ""}, {"a unit per all-reduce", "bucket_bytes: 0"}, {"buckets of 64 KiB", "bucket_bytes: 65536"}}},
      {"FSDP dp=2 x TP tp=2, SP", R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
       R"pb(mode: FSDP tensor_parallel { axis: "tp" sequence_parallel: true })pb",
       {{"overlapped", ""}, {"waited at once", "overlap_grad_reduce: false"}}},
      // Bucketed all-reduces of both kinds: the partial sums along tp, then
      // the replicas' average along dp (two ranks each).
      {"DDP dp=2 x TP tp=2, SP", R"pb(mesh { name: "dp" size: 2 } mesh { name: "tp" size: 2 })pb",
       R"pb(mode: DDP tensor_parallel { axis: "tp" sequence_parallel: true })pb",
       {{"default buckets", ""}, {"a unit per all-reduce", "bucket_bytes: 0"},
        {"waited at once", "overlap_grad_reduce: false"}}},
  };
  auto cluster = testing::StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok());
  constexpr int kSteps = 10;
  for (const Case& c : cases) {
    std::vector<std::vector<baton::v1::StepMetrics>> runs;
    for (const Variant& v : c.variants) {
      const std::string text = absl::StrCat("name: \"overlap\" ", kModel, c.mesh, " plan { ", c.plan, " ", v.plan,
                                            " } optimizer { lr: 0.003 max_grad_norm: 1.0 } data { batch_size: 16 } steps: ",
                                            kSteps);
      auto spec = ParseJobSpec(text, false);
      ASSERT_TRUE(spec.ok()) << spec.status();
      auto job = Job::Create(client->get(), *spec);
      ASSERT_TRUE(job.ok()) << c.what << " " << v.what << ": " << job.status();
      auto metrics = (*job)->Step(kSteps);
      ASSERT_TRUE(metrics.ok()) << c.what << " " << v.what << ": " << metrics.status();
      ASSERT_EQ(static_cast<int>(metrics->size()), kSteps);
      double wait = 0, comm = 0;
      for (const auto& m : *metrics) {
        wait += m.comm_wait_ms();
        comm += m.comm_ms();
      }
      std::printf("%-26s %-22s loss %.9f -> %.9f, exposed communication %.2f of %.2f ms per step\n", c.what, v.what,
                  metrics->front().loss(), metrics->back().loss(), wait / kSteps, comm / kSteps);
      runs.push_back(std::move(*metrics));
    }
    for (size_t v = 1; v < runs.size(); ++v) {
      int same = 0;
      for (int s = 0; s < kSteps; ++s) {
        const auto& a = runs[0][s];
        const auto& b = runs[v][s];
        const double x[2] = {a.loss(), a.grad_norm()}, y[2] = {b.loss(), b.grad_norm()};
        const bool equal = std::memcmp(x, y, sizeof(x)) == 0;
        same += equal;
        EXPECT_TRUE(equal) << c.what << ", " << c.variants[v].what << " step " << s + 1 << ": loss " << a.loss()
                           << " vs " << b.loss() << ", grad norm " << a.grad_norm() << " vs " << b.grad_norm();
      }
      std::printf("%-26s %s vs %s: %d of %d steps bit-identical (loss, grad norm)\n", c.what, c.variants[v].what,
                  c.variants[0].what, same, kSteps);
    }
  }
  testing::StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
