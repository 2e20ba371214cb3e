#include "worker/send_reaper.h"

#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>

namespace baton {
namespace {

// A send that completes when the test says so.
class HeldSend : public CommHandle {
 public:
  explicit HeldSend(std::shared_future<absl::Status> done) : done_(std::move(done)) {}
  absl::Status Wait() override { return done_.get(); }

 private:
  std::shared_future<absl::Status> done_;
};

TEST(SendReaperTest, LetsEachTensorGoWhenItsSendIsDoneAndFlushReportsTheFirstFailure) {
  SendReaper reaper;
  std::promise<absl::Status> first, second;
  at::Tensor a = at::zeros({4});
  at::Tensor b = at::zeros({4});
  reaper.Add(std::make_unique<HeldSend>(first.get_future().share()), a);
  reaper.Add(std::make_unique<HeldSend>(second.get_future().share()), b);
  EXPECT_EQ(a.use_count(), 2) << "held while its send is in flight";
  first.set_value(absl::OkStatus());
  for (int i = 0; i < 2000 && a.use_count() > 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::printf("after the first send: its tensor held %ld time(s), the second's %ld\n",
              static_cast<long>(a.use_count()), static_cast<long>(b.use_count()));
  EXPECT_EQ(a.use_count(), 1) << "let go once sent, before any Flush";
  EXPECT_EQ(b.use_count(), 2);
  second.set_value(absl::UnavailableError("peer gone"));
  const absl::Status flushed = reaper.Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_EQ(b.use_count(), 1);
  EXPECT_TRUE(reaper.Flush().ok()) << "a failure is reported once";
}

}  // namespace
}  // namespace baton
