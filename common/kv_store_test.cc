#include "common/kv_store.h"

#include <gtest/gtest.h>

#include <thread>

namespace baton {
namespace {

TEST(KeyValueStoreTest, GetWaitsForALaterSet) {
  KeyValueStore kv;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(kv.Set("a", "1").ok());
  });
  auto v = kv.Get("a", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "1");
}

TEST(KeyValueStoreTest, WaitTimesOutNamingTheMissingKey) {
  KeyValueStore kv;
  ASSERT_TRUE(kv.Set("present", "x").ok());
  absl::Time start = absl::Now();
  auto s = kv.Wait({"present", "absent"}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("absent"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("present,"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(KeyValueStoreTest, AddIsAtomicAcrossThreads) {
  KeyValueStore kv;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) ASSERT_TRUE(kv.Add("n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*kv.Add("n", 0), 1000);
  ASSERT_TRUE(kv.Set("s", "text").ok());
  EXPECT_EQ(kv.Add("s", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KeyValueStoreTest, CheckAndPrefixDelete) {
  KeyValueStore kv;
  for (const char* k : {"m1/a", "m1/b", "m2/a"}) ASSERT_TRUE(kv.Set(k, "v").ok());
  int64_t n = 0;
  EXPECT_TRUE(*kv.Check({"m1/a", "m2/a"}, &n));
  EXPECT_EQ(n, 3);
  EXPECT_EQ(*kv.Delete("m1/", true), 2);
  EXPECT_FALSE(*kv.Check({"m1/a"}, &n));
  EXPECT_EQ(n, 1);
}

TEST(KeyValueStoreTest, AbortPrefixEndsWaitsAtOnce) {
  KeyValueStore kv;
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv.AbortPrefix("mesh/7/", "worker-2 died");
  });
  absl::Time start = absl::Now();
  auto v = kv.Get("mesh/7/world/0", absl::Seconds(30));
  aborter.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(v.status().message().find("worker-2 died"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(kv.Get("mesh/8/x", absl::Milliseconds(1)).status().code() ==
              absl::StatusCode::kDeadlineExceeded);
}

TEST(KeyValueStoreTest, RejectsBadKeysAndValues) {
  KeyValueStore kv;
  EXPECT_EQ(kv.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set(std::string(5000, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("k", std::string(KeyValueStore::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
