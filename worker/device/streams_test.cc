// The ordering a GPU worker relies on, run on fake streams (queues this test
// runs in the order a GPU could pick when nothing forbids it): a collective
// starts after the compute that made its input, its consumer runs after it,
// and the host never waits to make it so. Each case runs the streams
// adversarially - the stream that would break the order first - and a
// counter-case without the ordering shows the harness sees the difference.
#include "worker/device/streams.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "worker/comm/stream_handle.h"
#include "worker/device/testing/fake_streams.h"

namespace baton {
namespace {

using testing::FakeStream;
using testing::RunUntilIdle;

// A reduce-scatter reads the gradient the backward writes: the comm stream,
// run first whenever it can, must still see the backward's value.
TEST(StreamOrder, ReduceScatterStartsAfterTheBackwardThatMadeItsInput) {
  FakeStream compute("compute"), comm("comm");
  float grad = 0, sent = -1;
  compute.Enqueue("backward", [&] { grad = 7; });
  auto done = IssueAfter(compute, comm, [&] { comm.Enqueue("reduce-scatter", [&] { sent = grad; }); }).done;
  // Issuing ran nothing: the host did not wait on either stream.
  EXPECT_EQ(compute.queued(), 2u);  // backward, record
  EXPECT_EQ(comm.queued(), 4u);     // wait, record (start), reduce-scatter, record (end)
  EXPECT_FALSE(done->Done());
  std::vector<std::string> log;
  ASSERT_TRUE(RunUntilIdle({&comm, &compute}, &log));
  std::printf("comm first, ordered: the reduce-scatter sent %.0f (the backward wrote 7)\n", sent);
  for (const auto& line : log) std::printf("  %s\n", line.c_str());
  EXPECT_EQ(sent, 7);
  EXPECT_TRUE(done->Done());

  // Without the event the same schedule sends the stale gradient.
  FakeStream compute2("compute"), comm2("comm");
  float grad2 = 0, sent2 = -1;
  compute2.Enqueue("backward", [&] { grad2 = 7; });
  comm2.Enqueue("reduce-scatter", [&] { sent2 = grad2; });
  ASSERT_TRUE(RunUntilIdle({&comm2, &compute2}));
  std::printf("comm first, unordered: the reduce-scatter sent %.0f\n", sent2);
  EXPECT_EQ(sent2, 0);
}

// A unit's forward reads the parameters its all-gather fills: waited on
// through the handle, the compute stream, run first whenever it can, still
// reads the gathered values; AVG's division runs after the gather too.
TEST(StreamOrder, GatherConsumerRunsAfterTheGather) {
  auto compute = std::make_shared<FakeStream>("compute");
  FakeStream comm("comm");
  auto watch = std::make_shared<EventWatch>([](const std::string&) {});
  float shard = 0, full = 0, used = -1;
  compute->Enqueue("copy shard into the send buffer", [&] { shard = 3; });
  Issued issued = IssueAfter(*compute, comm, [&] { comm.Enqueue("all-gather", [&] { full = shard * 2; }); });
  auto done = issued.done;
  StreamHandle handle("all-gather", compute, issued, watch, [&] { compute->Enqueue("avg", [&] { full /= 2; }); },
                      EventWatch::Clock::now() + std::chrono::seconds(10), std::make_shared<CommClock>());
  ASSERT_TRUE(handle.Wait().ok());
  EXPECT_FALSE(done->Done()) << "Wait blocked the host until the gather ran";
  compute->Enqueue("forward", [&] { used = full; });
  std::vector<std::string> log;
  ASSERT_TRUE(RunUntilIdle({compute.get(), &comm}, &log));
  for (const auto& line : log) std::printf("  %s\n", line.c_str());
  std::printf("compute first: the forward read %.0f (gathered 6, averaged over 2: 3)\n", used);
  EXPECT_EQ(used, 3);
}

// A second wait on the same handle enqueues nothing more (no second division).
TEST(StreamOrder, WaitOrdersOnce) {
  auto compute = std::make_shared<FakeStream>("compute");
  FakeStream comm("comm");
  auto watch = std::make_shared<EventWatch>([](const std::string&) {});
  int finishes = 0;
  Issued issued = IssueAfter(*compute, comm, [&] { comm.Enqueue("all-reduce", [] {}); });
  StreamHandle handle("all-reduce", compute, issued, watch, [&] { ++finishes; },
                      EventWatch::Clock::now() + std::chrono::seconds(10), std::make_shared<CommClock>());
  ASSERT_TRUE(handle.Wait().ok());
  ASSERT_TRUE(handle.Wait().ok());
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(compute->queued(), 4u);  // record (issue), record, wait, record (the wait's ends)
}

// A collective that never ends (a dead peer): the watch's thread names it past
// its deadline and calls the abort; a drain and every handle return it.
TEST(EventWatchTest, ACollectivePastItsDeadlineAbortsTheCommunicator) {
  std::atomic<int> aborts{0};
  std::string named;
  auto watch = std::make_shared<EventWatch>([&](const std::string& why) {
    named = why;
    aborts++;
  });
  auto stuck = std::make_shared<testing::FakeEvent>();
  const auto start = EventWatch::Clock::now();
  watch->Add("all-gather of layers.3", stuck, start + std::chrono::milliseconds(200));
  absl::Status s = watch->Drain(std::chrono::seconds(10));
  const double waited_ms = std::chrono::duration<double, std::milli>(EventWatch::Clock::now() - start).count();
  std::printf("drain returned after %.0f ms (deadline 200 ms): %s\n", waited_ms, s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("all-gather of layers.3"), std::string::npos);
  EXPECT_GE(waited_ms, 190);
  EXPECT_LT(waited_ms, 5000);
  for (int i = 0; i < 100 && aborts.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(named, "all-gather of layers.3");
  auto compute = std::make_shared<FakeStream>("compute");
  StreamHandle handle("all-gather", compute, Issued{stuck, stuck}, watch, nullptr, EventWatch::Clock::now(),
                      std::make_shared<CommClock>());
  EXPECT_EQ(handle.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(handle.WaitAside().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(EventWatchTest, DrainReturnsOnceEverythingRan) {
  auto watch = std::make_shared<EventWatch>([](const std::string&) { ADD_FAILURE() << "nothing was late"; });
  FakeStream comm("comm");
  auto a = comm.Record();
  auto b = comm.Record();
  watch->Add("a", a, EventWatch::Clock::now() + std::chrono::seconds(30));
  watch->Add("b", b, EventWatch::Clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(watch->Drain(std::chrono::milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(RunUntilIdle({&comm}));
  EXPECT_TRUE(watch->Drain(std::chrono::seconds(10)).ok());
  EXPECT_EQ(watch->pending(), 0u);
}

TEST(EventWatchTest, FailEndsADrainAtOnce) {
  auto watch = std::make_shared<EventWatch>([](const std::string&) {});
  watch->Add("recv", std::make_shared<testing::FakeEvent>(), EventWatch::Clock::now() + std::chrono::hours(1));
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    watch->Fail(absl::AbortedError("recv aborted: peer worker-1 died"));
  });
  const auto start = EventWatch::Clock::now();
  absl::Status s = watch->Drain(std::chrono::seconds(30));
  aborter.join();
  const double waited_ms = std::chrono::duration<double, std::milli>(EventWatch::Clock::now() - start).count();
  std::printf("an abort ended the drain after %.0f ms: %s\n", waited_ms, s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_LT(waited_ms, 5000);
}

// WaitAside (a send's reaper) blocks the host until the collective ran, and
// no longer than its deadline.
TEST(StreamOrder, WaitAsideBlocksUntilDoneOrDeadline) {
  auto compute = std::make_shared<FakeStream>("compute");
  auto watch = std::make_shared<EventWatch>([](const std::string&) {});
  auto done = std::make_shared<testing::FakeEvent>();
  StreamHandle late("send", compute, Issued{done, done}, watch, nullptr,
                    EventWatch::Clock::now() + std::chrono::milliseconds(50), std::make_shared<CommClock>());
  EXPECT_EQ(late.WaitAside().code(), absl::StatusCode::kDeadlineExceeded);
  StreamHandle handle("send", compute, Issued{done, done}, watch, nullptr,
                      EventWatch::Clock::now() + std::chrono::seconds(10), std::make_shared<CommClock>());
  std::thread gpu([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    done->Complete();  // the send ran
  });
  const auto start = EventWatch::Clock::now();
  EXPECT_TRUE(handle.WaitAside().ok());
  const double waited_ms = std::chrono::duration<double, std::milli>(EventWatch::Clock::now() - start).count();
  std::printf("WaitAside returned %.0f ms after the send was issued (it ran at 30 ms)\n", waited_ms);
  EXPECT_GE(waited_ms, 25);
  gpu.join();
}

// The step's communication figures from the device's clock: a collective's
// time in flight (its start to its end on the comm stream) and what the
// compute stream stalled on it (an event before its wait to one after).
// Alone, the stall is the whole collective; with 10 ms of other compute
// issued before the wait, an 8 ms collective is hidden.
TEST(StreamOrder, CommTimesComeFromTheDevicesEvents) {
  for (const double overlap_ms : {0.0, 10.0, 6.0}) {
    auto compute = std::make_shared<FakeStream>("compute");
    FakeStream comm("comm");
    auto watch = std::make_shared<EventWatch>([](const std::string&) {});
    auto clock = std::make_shared<CommClock>();
    compute->Enqueue("backward", [] {}, 5);
    Issued issued = IssueAfter(*compute, comm, [&] { comm.Enqueue("reduce-scatter", [] {}, 8); });
    StreamHandle handle("reduce-scatter", compute, issued, watch, nullptr,
                        EventWatch::Clock::now() + std::chrono::seconds(10), clock);
    if (overlap_ms > 0) compute->Enqueue("next unit's backward", [] {}, overlap_ms);
    ASSERT_TRUE(handle.Wait().ok());
    compute->Enqueue("optimizer", [] {}, 1);
    ASSERT_TRUE(RunUntilIdle({compute.get(), &comm}));
    ASSERT_TRUE(watch->Drain(std::chrono::seconds(10)).ok());
    const double exposed = std::max(0.0, 8 - overlap_ms);
    std::printf("8 ms reduce-scatter, %.0f ms of compute beside it: in flight %.1f ms, exposed %.1f ms (expect %.1f)\n",
                overlap_ms, clock->in_flight_ms(), clock->waited_ms(), exposed);
    EXPECT_DOUBLE_EQ(clock->in_flight_ms(), 8);
    EXPECT_DOUBLE_EQ(clock->waited_ms(), exposed);
  }
}

}  // namespace
}  // namespace baton
