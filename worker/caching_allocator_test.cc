#include "worker/caching_allocator.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

namespace baton {
namespace {

int64_t ThreadPageFaults() {
  struct rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

TEST(SizeClassTest, PagesAndAtMostASixteenthOver) {
  double worst = 0;
  for (size_t bytes = kMinCachedBytes; bytes < (size_t{1} << 31); bytes = bytes * 9 / 8 + 4093) {
    const size_t size = SizeClassOf(bytes);
    EXPECT_GE(size, bytes);
    EXPECT_EQ(size % 4096, 0u) << bytes;
    worst = std::max(worst, static_cast<double>(size - bytes) / static_cast<double>(bytes));
    EXPECT_EQ(SizeClassOf(size), size) << "a class's own size is in it";
  }
  std::printf("size classes: worst rounding %.4f of the request\n", worst);
  EXPECT_LE(worst, 1.0 / 16);
}

// One test, in order: the allocator is process-wide once installed.
TEST(CachingAllocatorTest, ReusesBlocksAccountsAndReturnsThem) {
  InstallCachingAllocator();
  ASSERT_TRUE(CachingAllocatorInstalled());
  ReleaseCachedBlocks();
  const AllocatorStats before = CachingAllocatorStats();
  auto user = std::make_unique<CacheUser>();  // as an Executor holds one

  // A step's pattern, three times: the first maps, the others reuse.
  auto step = [] {
    std::vector<at::Tensor> live;
    for (int64_t rows : {64, 256, 1024, 64, 256}) live.push_back(at::empty({rows, 1000}, at::kFloat));
    live.push_back(at::empty({4}, at::kFloat));  // from the heap
    for (auto& t : live) t.fill_(1);
    return static_cast<int64_t>(4 * 1000 * (64 + 256 + 1024 + 64 + 256));
  };
  const int64_t step_bytes = step();
  const AllocatorStats first = CachingAllocatorStats();
  step();
  const int64_t faults_before = ThreadPageFaults();
  step();
  const int64_t third_step_faults = ThreadPageFaults() - faults_before;
  const AllocatorStats third = CachingAllocatorStats();
  std::printf("the third step wrote %lld bytes of tensors and took %lld page faults\n",
              static_cast<long long>(step_bytes), static_cast<long long>(third_step_faults));
  EXPECT_LE(third_step_faults, 8) << "a step like the last one maps nothing and faults on nothing";
  std::printf("3 steps of 5 cached tensors (%lld bytes): misses %lld -> %lld, hits %lld -> %lld, reserved %lld\n",
              static_cast<long long>(step_bytes), static_cast<long long>(before.misses),
              static_cast<long long>(third.misses), static_cast<long long>(before.hits),
              static_cast<long long>(third.hits), static_cast<long long>(third.reserved_bytes));
  EXPECT_EQ(first.misses - before.misses, 5);
  EXPECT_EQ(third.misses, first.misses) << "later steps map nothing";
  EXPECT_EQ(third.hits - first.hits, 10);
  EXPECT_EQ(third.reserved_bytes, first.reserved_bytes) << "flat over steps";
  EXPECT_EQ(third.allocated_bytes, before.allocated_bytes) << "every tensor is gone";
  EXPECT_GE(third.peak_allocated_bytes - before.allocated_bytes, step_bytes);
  EXPECT_LE(third.cached_bytes - before.cached_bytes, step_bytes + step_bytes / 16);

  // The peak follows the live tensors, reset per step.
  ResetAllocatorPeaks();
  {
    at::Tensor a = at::empty({1 << 20}, at::kFloat);
    at::Tensor b = at::empty({1 << 19}, at::kFloat);
    a.fill_(0);  // their pages are there: a block made of them faults on none
    b.fill_(0);
  }
  const AllocatorStats peaks = CachingAllocatorStats();
  EXPECT_EQ(peaks.peak_allocated_bytes - peaks.allocated_bytes, 6 << 20);

  // A miss returns free memory first: what is mapped grows with the live
  // tensors, not with a cache beside them.
  const AllocatorStats cached = CachingAllocatorStats();
  {
    at::Tensor c = at::empty({3 << 20}, at::kFloat);  // 12 MiB: no free block is as large
    const AllocatorStats with_c = CachingAllocatorStats();
    std::printf("a 12 MiB miss with %lld bytes cached: reserved %lld -> %lld, cached -> %lld\n",
                static_cast<long long>(cached.cached_bytes), static_cast<long long>(cached.reserved_bytes),
                static_cast<long long>(with_c.reserved_bytes), static_cast<long long>(with_c.cached_bytes));
    EXPECT_EQ(with_c.misses, cached.misses + 1);
    EXPECT_EQ(with_c.assembled, cached.assembled + 1) << "made of the free blocks' pages";
    const int64_t faults_before_c = ThreadPageFaults();
    c.fill_(3.0f);
    const int64_t faults = ThreadPageFaults() - faults_before_c;
    const int64_t fresh_pages = ((12 << 20) - cached.cached_bytes) / 4096;
    std::printf("writing it faulted on %lld pages; %lld were not the free blocks'\n", static_cast<long long>(faults),
                static_cast<long long>(fresh_pages));
    EXPECT_LE(faults, fresh_pages + 64) << "the free blocks' pages moved into it";
    EXPECT_EQ(c.sum().item<double>(), 3.0 * (3 << 20));
    EXPECT_EQ(with_c.cached_bytes, 0) << "fewer than 12 MiB were cached: all of it is moved in";
    EXPECT_EQ(with_c.reserved_bytes, cached.reserved_bytes - cached.cached_bytes + (12 << 20));
  }
  {
    const AllocatorStats before_small = CachingAllocatorStats();
    at::Tensor small = at::empty({(64 << 10) / 4}, at::kFloat);  // 64 KiB: the 12 MiB block is the only free one
    const AllocatorStats with_small = CachingAllocatorStats();
    std::printf("a 64 KiB tensor with one 12 MiB block free: cached %lld -> %lld, reserved %lld -> %lld\n",
                static_cast<long long>(before_small.cached_bytes), static_cast<long long>(with_small.cached_bytes),
                static_cast<long long>(before_small.reserved_bytes), static_cast<long long>(with_small.reserved_bytes));
    EXPECT_EQ(before_small.cached_bytes, 12 << 20);
    EXPECT_EQ(with_small.hits, before_small.hits + 1) << "split from the free block";
    EXPECT_EQ(with_small.cached_bytes, (12 << 20) - (64 << 10)) << "the rest of it stays free";
    EXPECT_EQ(with_small.reserved_bytes, before_small.reserved_bytes) << "nothing mapped, nothing returned";
    small.fill_(1.0f);
  }
  EXPECT_EQ(CachingAllocatorStats().cached_bytes, 12 << 20) << "merged back whole";

  // Free blocks side by side merge: two 1 MiB blocks freed make room for a
  // 2 MiB one where they were, no mapping.
  {
    at::Tensor x = at::empty({1 << 18}, at::kFloat);
    at::Tensor y = at::empty({1 << 18}, at::kFloat);
    at::Tensor z = at::empty({1 << 18}, at::kFloat);
    const void* x_at = x.data_ptr();
    EXPECT_EQ(static_cast<const char*>(y.data_ptr()), static_cast<const char*>(x_at) + (1 << 20)) << "split in order";
    x = at::Tensor();
    y = at::Tensor();
    const AllocatorStats before_xy = CachingAllocatorStats();
    at::Tensor xy = at::empty({1 << 19}, at::kFloat);
    EXPECT_EQ(xy.data_ptr(), x_at) << "the merged block is the best fit";
    EXPECT_EQ(CachingAllocatorStats().misses, before_xy.misses);
  }

  // The last user goes: every free block back to the system.
  const AllocatorStats full = CachingAllocatorStats();
  user.reset();
  const AllocatorStats after = CachingAllocatorStats();
  std::printf("the last user went: reserved %lld -> %lld, cached %lld -> %lld (before the test %lld)\n",
              static_cast<long long>(full.reserved_bytes), static_cast<long long>(after.reserved_bytes),
              static_cast<long long>(full.cached_bytes), static_cast<long long>(after.cached_bytes),
              static_cast<long long>(before.reserved_bytes));
  EXPECT_GT(full.cached_bytes, 0);
  EXPECT_EQ(after.cached_bytes, 0);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes - before.cached_bytes);

  // With no user, a freed block is unmapped at once (an idle worker keeps nothing).
  {
    at::Tensor idle = at::empty({1 << 20}, at::kFloat);
    EXPECT_EQ(CachingAllocatorStats().reserved_bytes, after.reserved_bytes + (4 << 20));
  }
  EXPECT_EQ(CachingAllocatorStats().cached_bytes, 0);
  EXPECT_EQ(CachingAllocatorStats().reserved_bytes, after.reserved_bytes);

  // Tensors made and dropped on other threads (as communication threads do).
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 500; ++i) {
        at::Tensor x = at::empty({(i % 7 + 1) * 10000 + t}, at::kFloat);
        x.fill_(i);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(CachingAllocatorStats().allocated_bytes, before.allocated_bytes);
}

// Free memory in pieces, none large enough for the next tensor: past the
// live peak the pieces are moved into it (mremap), unless the job's predicted
// peak leaves room to map it afresh and keep the pieces for later.
TEST(CachingAllocatorTest, KeepsFreePiecesWithinThePrediction) {
  InstallCachingAllocator();
  ReleaseCachedBlocks();
  auto miss_after_fragmenting = [](int64_t expected_bytes) {
    CacheUser user(expected_bytes);
    at::empty({(9 << 20) / 4}, at::kFloat);  // one free block of 9 MiB, the live peak
    at::Tensor a = at::empty({(4 << 20) / 4}, at::kFloat);
    at::Tensor b = at::empty({(64 << 10) / 4}, at::kFloat);
    at::Tensor c = at::empty({(4 << 20) / 4}, at::kFloat);
    a = at::Tensor();
    c = at::Tensor();  // free: 4 MiB, and 4 MiB + the rest, b between them
    const AllocatorStats before = CachingAllocatorStats();
    at::Tensor big = at::empty({(8 << 20) / 4}, at::kFloat);
    const AllocatorStats after = CachingAllocatorStats();
    std::printf("predicted %lld MiB: an 8 MiB miss with %lld MiB free in pieces: assembled %lld, reserved %lld -> %lld MiB\n",
                static_cast<long long>(expected_bytes >> 20), static_cast<long long>(before.cached_bytes >> 20),
                static_cast<long long>(after.assembled - before.assembled),
                static_cast<long long>(before.reserved_bytes >> 20), static_cast<long long>(after.reserved_bytes >> 20));
    EXPECT_EQ(after.misses, before.misses + 1);
    return std::make_pair(after.assembled - before.assembled, after.reserved_bytes - before.reserved_bytes);
  };
  const auto [moved, moved_growth] = miss_after_fragmenting(0);
  EXPECT_EQ(moved, 1) << "no prediction: the pieces are moved, nothing grows";
  EXPECT_EQ(moved_growth, 0);
  const auto [kept, kept_growth] = miss_after_fragmenting(32 << 20);
  EXPECT_EQ(kept, 0) << "within the prediction: mapped afresh, the pieces kept";
  EXPECT_EQ(kept_growth, 8 << 20);
}

}  // namespace
}  // namespace baton
