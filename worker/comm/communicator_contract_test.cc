// One contract for every Communicator backend, parameterised over
// backend x group size x element count (0-element and uneven shards
// included). Every rank runs in its own thread of this process, each result is
// compared with an expectation computed locally from the deterministic inputs.
// Values are small integers stored as fp32, so every sum is exact and any
// reduction order must give the same bits.
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
#include "common/kv_store.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/nccl/nccl_communicator.h"

namespace baton {
namespace {

using CreateFn = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    Rendezvous*, const std::string&, int, int)>;

struct Backend {
  std::string name;
  CreateFn create;
  // Empty when the backend can run here; else why the test is skipped.
  std::function<std::string(int world)> unavailable;
};

std::vector<Backend> Backends() {
  return {
      // All ranks here share a host: the collectives that can go through
      // shared memory do, the rest over TCP.
      {"gloo",
       [](Rendezvous* r, const std::string& prefix, int rank, int size) {
         return CreateGlooCommunicator(r, prefix, rank, size, GlooOptions{});
       },
       [](int) { return std::string(); }},
      // Everything over TCP, as between hosts.
      {"gloo_tcp",
       [](Rendezvous* r, const std::string& prefix, int rank, int size) {
         GlooOptions options;
         options.shared_memory = false;
         return CreateGlooCommunicator(r, prefix, rank, size, options);
       },
       [](int) { return std::string(); }},
      {"nccl",
       [](Rendezvous* r, const std::string& prefix, int rank, int size) {
         NcclOptions options;
         options.device_index = rank;  // NCCL needs one GPU per rank
         return CreateNcclCommunicator(r, prefix, rank, size, options);
       },
       [](int world) { return NcclUnavailableReason(world); }},
  };
}

// Input element i of rank r.
float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + i % 977); }

at::Tensor Input(int rank, int64_t numel) {
  at::Tensor t = at::empty({numel}, at::kFloat);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < numel; ++i) p[i] = Value(rank, i);
  return t;
}

struct Param {
  int backend;
  int world;
  int64_t numel;
};

class CommunicatorContractTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    backend_ = Backends()[GetParam().backend];
    std::string why = backend_.unavailable(GetParam().world);
    if (!why.empty()) GTEST_SKIP() << backend_.name << " skipped: " << why;
  }

  // Builds one communicator per rank (concurrently: rendezvous blocks) and
  // runs `body` on every rank in its own thread.
  void RunOnAllRanks(const std::function<void(Communicator&)>& body) {
    const int n = GetParam().world;
    std::vector<std::unique_ptr<Communicator>> comms(n);
    std::vector<std::thread> threads;
    std::string prefix = absl::StrCat("test/", ++group_counter_, "/");
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        auto c = backend_.create(&kv_, prefix, r, n);
        ASSERT_TRUE(c.ok()) << c.status();
        comms[r] = std::move(*c);
      });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    for (int r = 0; r < n; ++r) ASSERT_NE(comms[r], nullptr);
    for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(*comms[r]); });
    for (auto& t : threads) t.join();
  }

  Backend backend_;
  KeyValueStore kv_;
  int group_counter_ = 0;
};

TEST_P(CommunicatorContractTest, AllGatherConcatenatesInRankOrder) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    at::Tensor out = at::full({n * k}, -1.0f);
    CommStats before = c.stats();
    ASSERT_TRUE(c.AllGather(Input(c.rank(), k), out).ok());
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(out.narrow(0, r * k, k).equal(Input(r, k))) << "rank " << c.rank() << " chunk " << r;
    }
    // P = n*k elements gathered: each rank moves P*(n-1)/n elements.
    EXPECT_EQ(c.stats().bytes_sent - before.bytes_sent, k * (n - 1) * 4);
    EXPECT_EQ(c.stats().bytes_received - before.bytes_received, k * (n - 1) * 4);
  });
}

TEST_P(CommunicatorContractTest, AllGatherMovesBfloat16Bitwise) {
  // Mixed precision all-gathers bf16 parameters.
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    at::Tensor out = at::full({n * k}, -1.0f).to(at::kBFloat16);
    ASSERT_TRUE(c.AllGather(Input(c.rank(), k).to(at::kBFloat16), out).ok());
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(out.narrow(0, r * k, k).equal(Input(r, k).to(at::kBFloat16))) << "chunk " << r;
    }
    EXPECT_EQ(c.stats().bytes_sent, k * (n - 1) * 2);  // half the bytes of fp32
  });
}

TEST_P(CommunicatorContractTest, AllGatherShardsHandlesUnevenAndEmptyChunks) {
  // Extent n*k+1 rows of width 3: torch.chunk makes the last chunks short or
  // empty; the gathered tensor must equal the original.
  const int64_t extent = GetParam().numel + 1;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    ChunkGeometry g(extent, n);
    at::Tensor whole = at::arange(extent * 3, at::kFloat).view({extent, 3});
    at::Tensor local = whole.narrow(0, g.offset(c.rank()), g.length(c.rank())).contiguous();
    at::Tensor full = at::zeros({extent, 3});
    ASSERT_TRUE(AllGatherShards(c, local, g, full).ok());
    EXPECT_TRUE(full.equal(whole)) << "rank " << c.rank() << " extent " << extent;
  });
}

TEST_P(CommunicatorContractTest, AllGatherShardsOfEvenChunksLandInPlace) {
  // Extent n*k rows: every piece goes straight into `full` (no padded copy);
  // a non-contiguous local piece (a column slice) is gathered by value.
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    const int64_t extent = n * k;
    ChunkGeometry g(extent, n);
    at::Tensor whole = at::arange(extent * 3, at::kFloat).view({extent, 3});
    at::Tensor wide = at::cat({whole, whole}, 1);
    at::Tensor local = wide.narrow(0, g.offset(c.rank()), k).narrow(1, 3, 3);
    if (k > 1) {
      ASSERT_FALSE(local.is_contiguous());
    }
    at::Tensor full = at::zeros({extent, 3});
    const void* where = full.data_ptr();
    ASSERT_TRUE(AllGatherShards(c, local, g, full).ok());
    EXPECT_TRUE(full.equal(whole)) << "rank " << c.rank() << " extent " << extent;
    EXPECT_EQ(full.data_ptr(), where);
    std::printf("rank %d: %lld even rows of width 3 gathered in place\n", c.rank(), static_cast<long long>(extent));
  });
}

TEST_P(CommunicatorContractTest, ReduceScatterSumAvgMax) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    at::Tensor sum = at::empty({k}), avg = at::empty({k}), max = at::empty({k});
    CommStats before = c.stats();
    ASSERT_TRUE(c.ReduceScatter(Input(c.rank(), n * k), sum, ReduceOp::kSum).ok());
    EXPECT_EQ(c.stats().bytes_sent - before.bytes_sent, k * (n - 1) * 4);
    ASSERT_TRUE(c.ReduceScatter(Input(c.rank(), n * k), avg, ReduceOp::kAvg).ok());
    ASSERT_TRUE(c.ReduceScatter(Input(c.rank(), n * k), max, ReduceOp::kMax).ok());
    for (int64_t j = 0; j < k; ++j) {
      float expect = 0;
      for (int r = 0; r < n; ++r) expect += Value(r, c.rank() * k + j);
      ASSERT_EQ(sum[j].item<float>(), expect) << "j=" << j;
      ASSERT_EQ(avg[j].item<float>(), expect / n) << "avg must be sum / n exactly";
      ASSERT_EQ(max[j].item<float>(), Value(n - 1, c.rank() * k + j));
      if (j > 64) break;  // the rest is checked in bulk below
    }
    EXPECT_TRUE(avg.equal(sum.div(n)));
  });
}

TEST_P(CommunicatorContractTest, AllReduceSumAvgMax) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    at::Tensor expect_sum = at::zeros({k});
    for (int r = 0; r < n; ++r) expect_sum += Input(r, k);
    at::Tensor t = Input(c.rank(), k);
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kSum).ok());
    EXPECT_TRUE(t.equal(expect_sum));
    t = Input(c.rank(), k);
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kAvg).ok());
    EXPECT_TRUE(t.equal(expect_sum.div(n)));
    t = Input(c.rank(), k);
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kMax).ok());
    EXPECT_TRUE(t.equal(Input(n - 1, k)));
  });
}

TEST_P(CommunicatorContractTest, AllToAllTransposesBlocks) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    // Block j of rank r's input is Input(r * n + j, k): what rank j receives from r.
    at::Tensor in = at::empty({n * k}), out = at::full({n * k}, -1.0f);
    for (int j = 0; j < n; ++j) in.narrow(0, j * k, k).copy_(Input(c.rank() * n + j, k));
    ASSERT_TRUE(c.AllToAll(in, out).ok());
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(out.narrow(0, r * k, k).equal(Input(r * n + c.rank(), k))) << "block from rank " << r;
    }
    EXPECT_EQ(c.stats().bytes_sent, (n - 1) * k * 4);
  });
}

TEST_P(CommunicatorContractTest, BroadcastFromLastRank) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int root = c.size() - 1;
    at::Tensor t = Input(c.rank(), k);
    ASSERT_TRUE(c.Broadcast(t, root).ok());
    EXPECT_TRUE(t.equal(Input(root, k)));
  });
}

TEST_P(CommunicatorContractTest, SendRecvRingAndBarrier) {
  if (GetParam().world < 2) GTEST_SKIP() << "a ring needs two ranks";
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
    at::Tensor got = at::full({k}, -1.0f);
    auto recv = c.RecvAsync(got, prev, kDefaultCollectiveTimeout);
    auto send = c.SendAsync(Input(c.rank(), k), next, kDefaultCollectiveTimeout);
    ASSERT_TRUE(send->Wait().ok());
    ASSERT_TRUE(recv->Wait().ok());
    EXPECT_TRUE(got.equal(Input(prev, k)));
    EXPECT_TRUE(c.Barrier().ok());
  });
}

// Issuing is not waiting, so compute overlaps communication: rank 0 issues
// an all-reduce and an all-gather, computes, and only then lets the other
// ranks issue theirs. If issuing blocked until the peers joined, rank 0 would
// wait for ranks that wait for it, and both operations would fail at their
// timeout instead of completing with the right values.
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

std::vector<Param> AllParams() {
  std::vector<Param> params;
  for (int b = 0; b < static_cast<int>(Backends().size()); ++b) {
    for (int world : {1, 2, 3, 4}) {
      for (int64_t numel : {0, 1, 5, 4099, 1 << 18}) params.push_back({b, world, numel});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorContractTest, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(Backends()[info.param.backend].name, "_world",
                                               info.param.world, "_numel", info.param.numel);
                         });

}  // namespace
}  // namespace baton
