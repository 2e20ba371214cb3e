// The self-check must pass on a healthy group and must fail, naming the
// element, when a communicator returns a wrong result (e.g. a backend AVG
// that is really SUM, the bug the seed lab found in gloo).
#include "worker/collective_check.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/kv_store.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/testing/sum_instead_of_avg.h"

namespace baton {
namespace {

std::vector<std::shared_ptr<Communicator>> MakeGroup(KeyValueStore* kv, int n) {
  std::vector<std::shared_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { comms[r] = *CreateGlooCommunicator(kv, "g/", r, n, GlooOptions{}); });
  }
  for (auto& t : threads) t.join();
  return comms;
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

}  // namespace
}  // namespace baton
