// The self-check must pass on a healthy group and must fail, naming the
// element, when a communicator returns a wrong result (e.g. a backend AVG
// that is really SUM, the bug the seed lab found in gloo).
#include "worker/collective_check.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/kv_store.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace baton {
namespace {

std::vector<std::unique_ptr<Communicator>> MakeGroup(KeyValueStore* kv, int n) {
  std::vector<std::unique_ptr<Communicator>> comms(n);
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

// A communicator whose AVG forgets to divide: the check must catch it.
class SumInsteadOfAvg : public Communicator {
 public:
  explicit SumInsteadOfAvg(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "buggy"; }
  std::unique_ptr<CommHandle> AllGatherAsync(const at::Tensor& i, const at::Tensor& o,
                                             Milliseconds t) override {
    return inner_->AllGatherAsync(i, o, t);
  }
  std::unique_ptr<CommHandle> ReduceScatterAsync(const at::Tensor& i, const at::Tensor& o,
                                                 ReduceOp op, Milliseconds t) override {
    return inner_->ReduceScatterAsync(i, o, op == ReduceOp::kAvg ? ReduceOp::kSum : op, t);
  }
  std::unique_ptr<CommHandle> AllReduceAsync(const at::Tensor& x, ReduceOp op,
                                             Milliseconds t) override {
    return inner_->AllReduceAsync(x, op, t);
  }
  std::unique_ptr<CommHandle> BroadcastAsync(const at::Tensor& x, int root, Milliseconds t) override {
    return inner_->BroadcastAsync(x, root, t);
  }
  std::unique_ptr<CommHandle> SendAsync(const at::Tensor& x, int p, Milliseconds t) override {
    return inner_->SendAsync(x, p, t);
  }
  std::unique_ptr<CommHandle> RecvAsync(const at::Tensor& x, int p, Milliseconds t) override {
    return inner_->RecvAsync(x, p, t);
  }
  std::unique_ptr<CommHandle> BarrierAsync(Milliseconds t) override { return inner_->BarrierAsync(t); }

 private:
  Communicator* inner_;
};

TEST(CollectiveCheckTest, CatchesAnAvgThatIsReallyASum) {
  KeyValueStore kv;
  auto comms = MakeGroup(&kv, 2);
  std::vector<v1::CollectiveResult> results[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      SumInsteadOfAvg buggy(comms[r].get());
      CollectiveCheckOptions o;
      o.ops = {v1::REDUCE_SCATTER_SUM, v1::REDUCE_SCATTER_AVG};
      o.numel = 64;
      o.iters = 1;
      results[r] = RunCollectiveChecks(buggy, o);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(results[0][0].passed());
  EXPECT_FALSE(results[0][1].passed());
  std::printf("buggy AVG reported: %s\n", results[0][1].error().c_str());
  EXPECT_NE(results[0][1].error().find("expected"), std::string::npos);
}

}  // namespace
}  // namespace baton
