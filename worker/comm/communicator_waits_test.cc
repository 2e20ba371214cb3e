// The Communicator contract (worker/comm/communicator_contract.h), how
// collectives wait and end: issuing returns before peers join, the clock
// counts waits on late peers only, wrong shapes are refused without breaking
// the group, an abort ends waits on peers that never come.
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/comm/communicator.h"
#include "worker/comm/communicator_contract.h"

namespace baton::comm_contract {
namespace {

TEST_P(CommunicatorContractTest, IssuingReturnsBeforePeersJoinSoComputeOverlaps) {
  const int64_t k = GetParam().numel;
  std::promise<void> rank0_issued;
  std::shared_future<void> go = rank0_issued.get_future().share();
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    const Milliseconds timeout(10000);
    if (c.rank() != 0) {
      ASSERT_EQ(go.wait_for(std::chrono::seconds(20)), std::future_status::ready)
          << "rank 0 never returned from issuing";
    }
    at::Tensor a = Input(c.rank(), k), gathered = at::empty({n * k});
    auto h1 = c.AllReduceAsync(a, ReduceOp::kSum, timeout);
    auto h2 = c.AllGatherAsync(Input(c.rank(), k), gathered, timeout);
    if (c.rank() == 0) {
      // Both operations are in flight and no peer has issued yet: compute.
      at::Tensor m = at::full({64, 64}, 0.5f);
      for (int i = 0; i < 8; ++i) m = m.matmul(m).div_(32);
      EXPECT_EQ(m[0][0].item<float>(), 0.5f);
      rank0_issued.set_value();
    }
    ASSERT_TRUE(h2->Wait().ok());
    ASSERT_TRUE(h1->Wait().ok());
    ASSERT_TRUE(h1->Wait().ok());  // waiting twice returns the same status
    at::Tensor expect = at::zeros({k});
    for (int r = 0; r < n; ++r) expect += Input(r, k);
    EXPECT_TRUE(a.equal(expect));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(gathered.narrow(0, r * k, k).equal(Input(r, k)));
  });
}

// The clock behind exposed communication: a rank that waits on a peer that
// comes late has that wait counted as waited (and in flight); an operation
// that completed while its rank computed costs its rank no wait.
TEST_P(CommunicatorContractTest, TheClockCountsWaitsOnLatePeersAndNotHiddenOperations) {
  const int64_t k = GetParam().numel;
  if (GetParam().world < 2 || k != 4099) GTEST_SKIP() << "one group of two or more ranks and one size are enough";
  constexpr auto kLate = std::chrono::milliseconds(600);
  RunOnAllRanks([&](Communicator& c) {
    const Milliseconds timeout(10000);
    // From a barrier (the ranks' threads start when they start), every rank
    // but 0 joins late: rank 0 waits about that long.
    ASSERT_TRUE(c.Barrier(timeout).ok());
    const double waited0 = c.clock().waited_ms(), flight0 = c.clock().in_flight_ms();
    if (c.rank() != 0) std::this_thread::sleep_for(kLate);
    at::Tensor a = Input(c.rank(), k);
    ASSERT_TRUE(c.AllReduce(a, ReduceOp::kSum, timeout).ok());
    const double waited = c.clock().waited_ms() - waited0, flight = c.clock().in_flight_ms() - flight0;
    if (c.rank() == 0) {
      std::printf("rank 0, peers %lld ms late: waited %.1f ms, in flight %.1f ms\n",
                  static_cast<long long>(kLate.count()), waited, flight);
      EXPECT_GE(waited, 0.6 * kLate.count());
      EXPECT_GE(flight, 0.6 * kLate.count());
    }
    // Everyone issues at once, then computes well past the operation's end
    // (a barrier after the wait makes sure of it for the next figure).
    ASSERT_TRUE(c.Barrier(timeout).ok());
    at::Tensor b = Input(c.rank(), k);
    auto h = c.AllReduceAsync(b, ReduceOp::kSum, timeout);
    std::this_thread::sleep_for(kLate);
    const double before = c.clock().waited_ms();
    ASSERT_TRUE(h->Wait().ok());
    const double hidden_wait = c.clock().waited_ms() - before;
    if (c.rank() == 0) std::printf("an all-reduce hidden behind %lld ms of compute: waited %.2f ms\n",
                                   static_cast<long long>(kLate.count()), hidden_wait);
    EXPECT_LT(hidden_wait, 0.5 * kLate.count());
  });
}

TEST_P(CommunicatorContractTest, WrongShapesAreRejectedWithoutBreakingTheGroup) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    auto s = c.AllGather(at::empty({k + 1}), at::empty({n * k}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    s = c.ReduceScatter(at::empty({n * k + 1}), at::empty({k}), ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(c.Send(at::empty({1}), c.rank()).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(at::empty({1}), n).code(), absl::StatusCode::kInvalidArgument);
    // The group still works.
    at::Tensor t = at::full({3}, 1.0f);
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kSum).ok());
    EXPECT_EQ(t[0].item<float>(), static_cast<float>(n));
  });
}

// Abort ends what waits on a peer that will never come - a receive, and a
// collective the other rank has not issued - within a moment and with the
// reason, long before their timeout; later calls fail the same way.
TEST_P(CommunicatorContractTest, AbortEndsWaitsOnPeersThatNeverCome) {
  if (GetParam().world != 2 || GetParam().numel != 5) GTEST_SKIP() << "once per backend, on two ranks";
  std::promise<void> aborted;
  std::shared_future<void> rank0_done = aborted.get_future().share();
  RunOnAllRanks([&](Communicator& c) {
    if (c.rank() == 1) {
      // Joins the all-reduce only once rank 0 gave up on it, so the
      // operation left running underneath ends before the group is torn down.
      ASSERT_EQ(rank0_done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      at::Tensor t = at::full({5}, 1.0f);
      (void)c.AllReduce(t, ReduceOp::kSum, Milliseconds(5000));
      return;
    }
    const Milliseconds timeout(30000);
    at::Tensor got = at::empty({5}), sum = at::full({5}, 1.0f);
    auto recv = c.RecvAsync(got, 1, timeout);
    auto reduce = c.AllReduceAsync(sum, ReduceOp::kSum, timeout);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.Abort("rank 1 (worker-1) is dead");
    });
    const auto start = std::chrono::steady_clock::now();
    // Both wait while the abort comes: the all-reduce here, the receive on
    // another thread.
    absl::Status r;
    std::thread receiver([&] { r = recv->Wait(); });
    const absl::Status a = reduce->Wait();
    receiver.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    aborter.join();
    std::printf("%s: receive and all-reduce aborted after %.3f s (timeout 30 s): %s | %s\n", c.backend().c_str(),
                seconds, r.ToString().c_str(), a.ToString().c_str());
    EXPECT_EQ(r.code(), absl::StatusCode::kAborted) << r;
    EXPECT_EQ(a.code(), absl::StatusCode::kAborted) << a;
    EXPECT_TRUE(absl::StrContains(r.message(), "rank 1 (worker-1) is dead")) << r;
    EXPECT_LT(seconds, 2.0);
    const absl::Status later = c.Barrier(Milliseconds(1000));
    EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
    aborted.set_value();
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorContractTest, ::testing::ValuesIn(AllParams()), ParamName);

}  // namespace
}  // namespace baton::comm_contract
