// Every placement transition on one mesh axis, run with real gloo
// communicators on 2 and 3 ranks, on an even (4, 2) and an uneven (5, 3)
// tensor: each result is compared exactly with the piece the target
// placement names, and the bytes each rank sent with the plan's formula.
#include "worker/redistribute.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/kv_store.h"
#include "mesh/redistribute.h"
#include "mesh/shard_geometry.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace baton {
namespace {

// Integer weights summing to 1: rank r's Partial addend is c[r] * global,
// exact in fp32.
float PartialWeight(int r, int n) { return n == 2 ? (r == 0 ? 2.0f : -1.0f) : (r < 2 ? 1.0f : -1.0f); }

at::Tensor PieceOf(const at::Tensor& global, const Placement& p, int r, int n) {
  if (p.is_replicate()) return global.clone();
  if (p.is_partial()) return global.mul(PartialWeight(r, n));
  ChunkGeometry g(global.size(p.dim()), n);
  return global.narrow(p.dim(), g.offset(r), g.length(r)).contiguous();
}

struct Case {
  std::vector<int64_t> shape;
  int n;
  Placement from, to;
};

TEST(RedistributeTest, EveryTransitionIsExactAndMovesThePlannedBytes) {
  std::vector<Case> cases;
  const std::vector<std::pair<Placement, Placement>> transitions = {
      {Placement::Shard(0), Placement::Replicate()},   {Placement::Partial(), Placement::Replicate()},
      {Placement::Partial(), Placement::Shard(0)},     {Placement::Replicate(), Placement::Shard(0)},
      {Placement::Shard(0), Placement::Shard(1)},      {Placement::Replicate(), Placement::Partial()},
      {Placement::Shard(1), Placement::Replicate()},   {Placement::Shard(1), Placement::Shard(0)},
      {Placement::Partial(), Placement::Shard(1)},     {Placement::Shard(0), Placement::Partial()}};
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 2}, {5, 3}}) {
    for (int n : {2, 3}) {
      for (const auto& [from, to] : transitions) cases.push_back({shape, n, from, to});
    }
  }
  // One group of communicators per group size, kept for all its cases (a
  // rendezvous per case churned ports fast enough for a stale connection to
  // reach a new listener now and then), the bytes each case sent measured
  // as the change of the counters.
  KeyValueStore kv;
  for (int n : {2, 3}) {
    std::vector<std::unique_ptr<Communicator>> comms(n);
    {
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
          auto comm = CreateGlooCommunicator(&kv, absl::StrCat("redistribute/", n, "/"), r, n, GlooOptions{});
          ASSERT_TRUE(comm.ok()) << comm.status();
          comms[r] = std::move(*comm);
        });
      }
      for (auto& t : threads) t.join();
    }
    for (int r = 0; r < n; ++r) ASSERT_NE(comms[r], nullptr);
    for (const Case& c : cases) {
      if (c.n != n) continue;
      const at::Tensor global = at::arange(NumElements(c.shape), at::kFloat).view(c.shape).add(1);
      auto plan = PlanRedistribute(c.shape, c.from, c.to, c.n, 4);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<at::Tensor> results(c.n);
      std::vector<int64_t> sent(c.n, -1);
      std::vector<std::thread> threads;
      for (int r = 0; r < c.n; ++r) {
        threads.emplace_back([&, r] {
          const int64_t before = comms[r]->stats().bytes_sent;
          auto out = Redistribute(PieceOf(global, c.from, r, c.n), c.shape, c.from, c.to, *comms[r]);
          ASSERT_TRUE(out.ok()) << out.status();
          results[r] = *out;
          sent[r] = comms[r]->stats().bytes_sent - before;
        });
      }
      for (auto& t : threads) t.join();
      bool exact = true;
      if (c.to.is_partial()) {
        at::Tensor sum = at::zeros(c.shape);
        for (const auto& t : results) sum.add_(t);
        exact = sum.equal(global);
      } else {
        for (int r = 0; r < c.n; ++r) exact &= results[r].defined() && results[r].equal(PieceOf(global, c.to, r, c.n));
      }
      std::printf("(%s) over %d: %-34s measured %lld B per rank\n", absl::StrJoin(c.shape, ", ").c_str(), c.n,
                  plan->ToString().c_str(), (long long)sent[0]);
      EXPECT_TRUE(exact) << plan->ToString();
      for (int r = 0; r < c.n; ++r) EXPECT_EQ(sent[r], plan->bytes_per_rank) << plan->ToString() << " rank " << r;
    }
  }
}

TEST(RedistributeTest, AWrongLocalPieceIsRefused) {
  KeyValueStore kv;
  auto comm = CreateGlooCommunicator(&kv, "one/", 0, 1, GlooOptions{});
  ASSERT_TRUE(comm.ok());
  auto out = Redistribute(at::zeros({3, 2}), {4, 2}, Placement::Replicate(), Placement::Shard(0), **comm);
  std::printf("%s\n", out.status().ToString().c_str());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
