#include "worker/step_thread.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

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

// A source whose fd is one end of a socket pair: every byte written to the
// other end is read on the step thread.
class PipeSource : public StepThread::Source {
 public:
  PipeSource() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    read_end_ = fds[0];
    write_end_ = fds[1];
  }
  ~PipeSource() override {
    ::close(read_end_);
    ::close(write_end_);
  }
  std::vector<int> fds() override { return {read_end_}; }
  void Ready(int fd, short) override {
    char c;
    if (::read(fd, &c, 1) != 1) return;
    absl::MutexLock lock(&mu_);
    threads_.insert(std::this_thread::get_id());
    ++bytes_;
  }
  void Send() { ASSERT_EQ(::write(write_end_, "x", 1), 1); }
  int bytes() {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }
  void AwaitBytes(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return bytes_ >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10))) << bytes_ << " of " << n;
  }
  std::set<std::thread::id> threads() {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

 private:
  int read_end_ = -1, write_end_ = -1;
  absl::Mutex mu_;
  int bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

TEST(StepThreadTest, ASourceIsServedOnTheThreadBetweenRuns) {
  PipeSource source;  // outlives the thread
  StepThread steps;
  source.Send();  // before Serve: waits in the socket
  steps.Serve(&source);
  source.AwaitBytes(1);
  constexpr int kRounds = 200;
  for (int i = 0; i < kRounds; ++i) {
    source.Send();
    int ran = 0;
    steps.Run([&] { ran = 1; });  // a Run is served while the source is too
    EXPECT_EQ(ran, 1);
  }
  source.AwaitBytes(1 + kRounds);
  const std::set<std::thread::id> on = source.threads();
  std::printf("%d bytes read on %zu thread(s), interleaved with %d Runs\n", source.bytes(), on.size(), kRounds);
  ASSERT_EQ(on.size(), 1u);
  EXPECT_EQ(*on.begin(), steps.id());
  steps.Serve(nullptr);  // no longer served
  steps.Run([] {});
  source.Send();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(source.bytes(), 1 + kRounds);
}

TEST(StepThreadTest, DestroyedIdleOrUnused) {
  { StepThread unused; }
  StepThread used;
  used.Run([] {});
}

}  // namespace
}  // namespace baton
