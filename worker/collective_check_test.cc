// The self-check must pass on a healthy group and must fail, naming the
// element, when a communicator returns a wrong result (e.g. a backend AVG
// that is really SUM, the bug the seed lab found in gloo).
#include "worker/collective_check.h"

#include <gtest/gtest.h>

#include <iterator>
#include <thread>

#include "common/kv_store.h"
#include "worker/caching_allocator.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/testing/gloo_group.h"
#include "worker/comm/testing/sum_instead_of_avg.h"

namespace baton {
namespace {

// The worker's tensor allocator, as in baton-worker: installed before any
// test makes a tensor.
class WorkerAllocator : public ::testing::Environment {
 public:
  void SetUp() override { InstallCachingAllocator(); }
};
::testing::Environment* const kWorkerAllocator = ::testing::AddGlobalTestEnvironment(new WorkerAllocator);

std::vector<std::shared_ptr<Communicator>> MakeGroup(KeyValueStore* kv, int n) {
  auto group = testing::GlooGroup(kv, "g/", n);
  return {std::make_move_iterator(group.begin()), std::make_move_iterator(group.end())};
}

TEST(CollectiveCheckTest, AllOperationsPassWithRingByteCounts) {
  KeyValueStore kv;
  const int n = 2;
  const int64_t p = 1000;
  auto comms = MakeGroup(&kv, n);
  std::vector<std::vector<v1::CollectiveResult>> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CollectiveCheckOptions o;
      o.numel = p;
      o.iters = 2;
      o.axis = "world";
      o.global_rank = r;
      results[r] = RunCollectiveChecks(*comms[r], o);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(results[r].size(), AllCollectiveOps().size());
    for (const auto& res : results[r]) {
      EXPECT_TRUE(res.passed()) << v1::CollectiveOp_Name(res.op()) << ": " << res.error();
      if (res.op() == v1::ALL_GATHER || res.op() == v1::REDUCE_SCATTER_SUM ||
          res.op() == v1::REDUCE_SCATTER_AVG) {
        // P*(N-1)/N elements of 4 bytes.
        std::printf("%s bytes per rank %lld (P(N-1)/N*4 = %lld)\n",
                    v1::CollectiveOp_Name(res.op()).c_str(), (long long)res.bytes_sent(),
                    (long long)(p * (n - 1) / n * 4));
        EXPECT_EQ(res.bytes_sent(), p * (n - 1) / n * 4);
      }
    }
  }
}

TEST(CollectiveCheckTest, CatchesAnAvgThatIsReallyASum) {
  KeyValueStore kv;
  auto comms = MakeGroup(&kv, 2);
  std::vector<v1::CollectiveResult> results[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      testing::SumInsteadOfAvg buggy(comms[r]);
      CollectiveCheckOptions o;
      o.ops = {v1::REDUCE_SCATTER_SUM, v1::REDUCE_SCATTER_AVG};
      o.numel = 64;
      o.iters = 1;
      o.axis = "dp";
      o.global_rank = 4 + r;
      results[r] = RunCollectiveChecks(buggy, o);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(results[0][0].passed());
  EXPECT_FALSE(results[0][1].passed());
  for (int r = 0; r < 2; ++r) {
    const std::string& error = results[r][1].error();
    std::printf("buggy AVG reported: %s\n", error.c_str());
    // Which rank, along which axis, which element, what and what not.
    EXPECT_NE(error.find("rank " + std::to_string(4 + r) + " (" + std::to_string(r) + " of 2 along \"dp\")"),
              std::string::npos) << error;
    EXPECT_NE(error.find("element 0 is "), std::string::npos) << error;
    EXPECT_NE(error.find(", expected "), std::string::npos) << error;
  }
}

// A check keeps its buffers between iterations (as a job does between
// steps): more iterations map no more blocks, so what it times is the
// collectives, not fresh pages. Uncached, every iteration maps afresh.
TEST(CollectiveCheckTest, IterationsReuseTheirBuffers) {
  ASSERT_TRUE(CachingAllocatorInstalled());
  KeyValueStore kv;
  auto comms = MakeGroup(&kv, 2);
  auto blocks_mapped = [&](int iters) {
    const AllocatorStats before = CachingAllocatorStats();
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        CollectiveCheckOptions o;
        o.ops = {v1::ALL_REDUCE_SUM, v1::ALL_GATHER_UNEVEN, v1::REDUCE_SCATTER_SUM, v1::SEND_RECV_RING};
        o.numel = 1 << 16;  // 256 KiB tensors: the allocator's cached sizes
        o.iters = iters;
        o.axis = "dp";
        o.global_rank = r;
        for (const auto& res : RunCollectiveChecks(*comms[r], o)) {
          EXPECT_TRUE(res.passed()) << v1::CollectiveOp_Name(res.op()) << ": " << res.error();
        }
      });
    }
    for (auto& t : threads) t.join();
    return CachingAllocatorStats().misses - before.misses;
  };
  const int64_t two = blocks_mapped(2);
  const int64_t twelve = blocks_mapped(12);
  std::printf("blocks mapped by a check of 4 collectives on 2 ranks: 2 iterations %lld, 12 iterations %lld\n",
              static_cast<long long>(two), static_cast<long long>(twelve));
  EXPECT_GT(two, 0);
  EXPECT_LT(twelve, 2 * two);
}

}  // namespace
}  // namespace baton
