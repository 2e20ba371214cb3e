// The dispatcher's fan-out against in-process fake workers: a failure is
// always handed to the failure grace (also when every call had already returned),
// the others get the grace's time to return by themselves, and calls to
// workers the failure grace names hopeless are cancelled at once. A fan-out put on
// the wire (Start) runs while its caller waits for another, and one dropped
// unwaited is cancelled.
#include "controller/dispatcher.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace baton {
namespace {

// RunStep fails at once, or blocks until `release` (or its deadline).
class FakeWorker final : public baton::v1::Worker::Service {
 public:
  enum Mode { kFail, kBlockUntilReleased };
  explicit FakeWorker(Mode mode) : mode_(mode) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeWorker() override {
    if (!release.HasBeenNotified()) release.Notify();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest*,
                       baton::v1::RunStepResponse*) override {
    ++arrived;
    if (mode_ == kFail) return grpc::Status(grpc::StatusCode::INTERNAL, "this rank failed");
    while (!release.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
      if (ctx->IsCancelled()) {
        ++cancelled;
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
    }
    return grpc::Status(grpc::StatusCode::ABORTED, "released by the abort");
  }

  absl::Notification release;
  std::atomic<int> arrived{0};
  std::atomic<int> cancelled{0};

 private:
  Mode mode_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

using Results = std::vector<CallResult<baton::v1::RunStepResponse>>;

Results RunSteps(Dispatcher& d, const std::vector<std::string>& addresses, const FailureGrace* grace) {
  std::vector<WorkerTarget> targets;
  for (const auto& a : addresses) targets.push_back({"", a});
  std::string reason;
  FanOut fan_out;
  fan_out.deadline = absl::Seconds(30);
  fan_out.failure_grace = grace;
  return d.Call<RunStepRpc>(targets, [](size_t) { return baton::v1::RunStepRequest(); }, fan_out, &reason);
}

TEST(DispatcherTest, EveryCallFailingAtOnceStillReachesTheDrain) {
  FakeWorker a(FakeWorker::kFail), b(FakeWorker::kFail);
  Dispatcher d(GrpcStubFactory({}));
  int drained = 0;
  const FailureGrace grace{[&](const std::vector<grpc::Status>&, const std::string&) {
                      ++drained;
                      return std::vector<size_t>();
                    },
                    absl::Seconds(5)};
  for (const auto& addresses : {std::vector<std::string>{a.address()}, {a.address(), b.address()}}) {
    drained = 0;
    auto results = RunSteps(d, addresses, &grace);
    std::printf("%zu calls, all failed at once: the drain ran %d time(s)\n", addresses.size(), drained);
    EXPECT_EQ(drained, 1);
    for (const auto& r : results) EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  }
}

TEST(DispatcherTest, TheOthersReturnByThemselvesOnceTold) {
  FakeWorker failing(FakeWorker::kFail), waiting(FakeWorker::kBlockUntilReleased);
  Dispatcher d(GrpcStubFactory({}));
  const FailureGrace grace{[&](const std::vector<grpc::Status>& so_far, const std::string&) {
                      EXPECT_EQ(so_far[0].error_code(), grpc::StatusCode::INTERNAL);
                      waiting.release.Notify();  // as the mesh's abort wakes a rank
                      return std::vector<size_t>();
                    },
                    absl::Seconds(10)};
  const absl::Time start = absl::Now();
  auto results = RunSteps(d, {failing.address(), waiting.address()}, &grace);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("the waiting rank returned by itself after %.3f s: %s\n", absl::ToDoubleSeconds(results[1].elapsed),
              results[1].status.error_message().c_str());
  EXPECT_EQ(results[1].status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_LT(seconds, 5.0);
}

TEST(DispatcherTest, HopelessCallsAreCancelledAtOnceTheRestAfterTheDrain) {
  FakeWorker failing(FakeWorker::kFail), dead(FakeWorker::kBlockUntilReleased),
      stuck(FakeWorker::kBlockUntilReleased);
  Dispatcher d(GrpcStubFactory({}));
  // A drain long enough that "at once" and "after it" stay apart on a slow machine.
  const FailureGrace grace{[&](const std::vector<grpc::Status>&, const std::string&) { return std::vector<size_t>{1}; },
                    absl::Seconds(3)};
  auto results = RunSteps(d, {failing.address(), dead.address(), stuck.address()}, &grace);
  std::printf("hopeless call cancelled after %.3f s, the stuck one after %.3f s (drain 3 s)\n",
              absl::ToDoubleSeconds(results[1].elapsed), absl::ToDoubleSeconds(results[2].elapsed));
  EXPECT_EQ(results[1].status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(results[1].elapsed, absl::Seconds(2));
  EXPECT_EQ(results[2].status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_GE(results[2].elapsed, absl::Seconds(3));
  EXPECT_LT(results[2].elapsed, absl::Seconds(8));
}

bool WaitUntil(const std::function<bool()>& cond) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!cond()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(DispatcherTest, AStartedFanOutRunsWhileItsCallerWaitsForAnother) {
  FakeWorker first(FakeWorker::kBlockUntilReleased), second(FakeWorker::kBlockUntilReleased);
  Dispatcher d(GrpcStubFactory({}));
  auto request = [](size_t) { return baton::v1::RunStepRequest(); };
  auto a = d.Start<RunStepRpc>({{"", first.address()}}, request, absl::Seconds(30));
  auto b = d.Start<RunStepRpc>({{"", second.address()}}, request, absl::Seconds(30));
  // Both calls reach their workers before anyone waits.
  const bool both = WaitUntil([&] { return first.arrived == 1 && second.arrived == 1; });
  std::printf("two fan-outs started, none waited for: %d and %d calls arrived, %d in flight\n", first.arrived.load(),
              second.arrived.load(), d.in_flight());
  EXPECT_TRUE(both);
  EXPECT_EQ(d.in_flight(), 2);
  first.release.Notify();
  second.release.Notify();
  auto ra = a->Wait(FanOut());
  auto rb = b->Wait(FanOut());
  EXPECT_EQ(ra[0].status.error_code(), grpc::StatusCode::ABORTED);  // the fake's answer once released
  EXPECT_EQ(rb[0].status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(d.in_flight(), 0);
}

TEST(DispatcherTest, AStartedFanOutDroppedUnwaitedIsCancelled) {
  FakeWorker stuck(FakeWorker::kBlockUntilReleased);
  Dispatcher d(GrpcStubFactory({}));
  auto pending = d.Start<RunStepRpc>({{"", stuck.address()}}, [](size_t) { return baton::v1::RunStepRequest(); },
                                     absl::Seconds(30));
  ASSERT_TRUE(WaitUntil([&] { return stuck.arrived == 1; }));
  const absl::Time start = absl::Now();
  pending.reset();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const bool seen = WaitUntil([&] { return stuck.cancelled == 1; });
  std::printf("dropped unwaited: returned after %.3f s, the worker saw the cancellation: %d, %d in flight\n", seconds,
              seen, d.in_flight());
  EXPECT_TRUE(seen);
  EXPECT_EQ(d.in_flight(), 0);
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace baton
