#include "common/process.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>

namespace baton {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(ProcessMemoryTest, ResidentPeakAndSharedFollowWhatIsTouched) {
  const ProcessMemory before = ReadProcessMemory();
  ASSERT_GT(before.resident, 0);
  EXPECT_GE(before.peak, before.resident);
  // 64 MiB private and 16 MiB shared (tmpfs-backed, as the collectives'
  // segments are), every page touched.
  void* priv = mmap(nullptr, 64 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* shared = mmap(nullptr, 16 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(priv, MAP_FAILED);
  ASSERT_NE(shared, MAP_FAILED);
  std::memset(priv, 1, 64 * kMiB);
  std::memset(shared, 1, 16 * kMiB);
  const ProcessMemory after = ReadProcessMemory();
  std::printf("resident %lld -> %lld MiB, peak %lld -> %lld MiB, shared %lld -> %lld MiB\n",
              static_cast<long long>(before.resident / kMiB), static_cast<long long>(after.resident / kMiB),
              static_cast<long long>(before.peak / kMiB), static_cast<long long>(after.peak / kMiB),
              static_cast<long long>(before.shared / kMiB), static_cast<long long>(after.shared / kMiB));
  EXPECT_GE(after.resident - before.resident, 78 * kMiB);
  EXPECT_GE(after.peak, after.resident - kMiB);  // the kernel's counters lag a little
  EXPECT_GE(after.shared - before.shared, 16 * kMiB);
  munmap(priv, 64 * kMiB);
  munmap(shared, 16 * kMiB);
  const ProcessMemory released = ReadProcessMemory();
  EXPECT_LE(released.resident, after.resident - 78 * kMiB);
  EXPECT_GE(released.peak, after.resident - kMiB);  // the high-water mark stays

  // Read once per step of a job: cheap.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) ReadProcessMemory();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
  std::printf("one read: %.1f us\n", us);
}

}  // namespace
}  // namespace baton
