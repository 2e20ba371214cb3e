// The Communicator contract (worker/comm/communicator_contract.h), what the
// collectives compute: every result compared with an expectation computed
// locally from the deterministic inputs.
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

// NCCL on device memory (a GPU worker's tensors): each collective runs on the
// communicator's stream after what the caller's stream enqueued, the caller's
// stream waits for it (worker/device/streams.h), and the host waits once, in
// Drain. The results are the host path's, bit for bit.
class DeviceMemoryContractTest : public CommunicatorContractTest {};

TEST_P(DeviceMemoryContractTest, CollectivesMatchTheHostOnes) {
  const int64_t k = GetParam().numel;
  RunOnAllRanks([&](Communicator& c) {
    const int n = c.size();
    // The contract gives rank r the GPU of index r (communicator_contract.cc).
    const at::TensorOptions device = at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(c.rank()));
    const at::Tensor input = Input(c.rank(), n * k).to(device.device());
    at::Tensor gathered = at::full({n * k}, -1.0f, device), avg = at::full({k}, -1.0f, device);
    at::Tensor sum = input.clone();
    ASSERT_TRUE(c.AllGather(input.narrow(0, 0, k).contiguous(), gathered).ok());
    ASSERT_TRUE(c.ReduceScatter(input, avg, ReduceOp::kAvg).ok());
    ASSERT_TRUE(c.AllReduce(sum, ReduceOp::kSum).ok());
    ASSERT_TRUE(c.Drain(std::chrono::seconds(60)).ok());
    at::Tensor want_gathered = at::empty({n * k}), want_sum = at::zeros({n * k});
    for (int r = 0; r < n; ++r) {
      want_gathered.narrow(0, r * k, k).copy_(Input(r, n * k).narrow(0, 0, k));
      want_sum.add_(Input(r, n * k));
    }
    const at::Tensor want_avg = want_sum.narrow(0, c.rank() * k, k).div(n);
    EXPECT_TRUE(gathered.cpu().equal(want_gathered)) << "rank " << c.rank();
    EXPECT_TRUE(avg.cpu().equal(want_avg)) << "rank " << c.rank();
    EXPECT_TRUE(sum.cpu().equal(want_sum)) << "rank " << c.rank();
    std::printf("rank %d of %d: all-gather, reduce-scatter (avg) and all-reduce of %lld elements on %s\n", c.rank(),
                n, static_cast<long long>(k), input.device().str().c_str());
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorContractTest, ::testing::ValuesIn(AllParams()), ParamName);

// Device memory is NCCL's alone (gloo's collectives run on host memory).
std::vector<Param> NcclParams() {
  std::vector<Param> out;
  for (const Param& p : AllParams()) {
    if (Backends()[p.backend].name == "nccl") out.push_back(p);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Nccl, DeviceMemoryContractTest, ::testing::ValuesIn(NcclParams()), ParamName);

}  // namespace
}  // namespace baton::comm_contract
