#include "worker/step_thread.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace baton {
namespace {

TEST(StepThreadTest, EveryCallerRunsOnTheOneThreadInTurn) {
  StepThread steps;
  constexpr int kCallers = 8, kCalls = 50;
  absl::Mutex mu;
  std::set<std::thread::id> ran_on, callers;
  std::atomic<int> inside{0}, most_inside{0}, total{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&] {
      {
        absl::MutexLock lock(&mu);
        callers.insert(std::this_thread::get_id());
      }
      for (int i = 0; i < kCalls; ++i) {
        int seen = -1;
        steps.Run([&] {
          const int now = ++inside;
          most_inside = std::max(most_inside.load(), now);
          {
            absl::MutexLock lock(&mu);
            ran_on.insert(std::this_thread::get_id());
          }
          seen = ++total;
          --inside;
        });
        EXPECT_GT(seen, 0) << "Run returned before its function ran";
      }
    });
  }
  for (auto& t : threads) t.join();
  std::printf("%d calls from %d threads ran on %zu thread(s), at most %d at once\n", total.load(), kCallers,
              ran_on.size(), most_inside.load());
  EXPECT_EQ(total.load(), kCallers * kCalls);
  ASSERT_EQ(ran_on.size(), 1u);
  EXPECT_EQ(*ran_on.begin(), steps.id());
  EXPECT_EQ(callers.count(steps.id()), 0u);
  EXPECT_EQ(most_inside.load(), 1);
  // Named apart from the threads that ask (gRPC's pool), for perf and top.
  char name[16] = {};
  steps.Run([&] { pthread_getname_np(pthread_self(), name, sizeof(name)); });
  std::printf("the step thread is named \"%s\"\n", name);
  EXPECT_STREQ(name, "baton-step");
}

TEST(StepThreadTest, AnExceptionReachesItsCallerAndTheThreadServesOn) {
  StepThread steps;
  EXPECT_THROW(steps.Run([] { throw std::runtime_error("step failed"); }), std::runtime_error);
  int ran = 0;
  steps.Run([&] { ran = 1; });
  EXPECT_EQ(ran, 1);
}

TEST(StepThreadTest, DestroyedIdleOrUnused) {
  { StepThread unused; }
  StepThread used;
  used.Run([] {});
}

}  // namespace
}  // namespace baton
