// How a gloo group fails: a peer that is gone or silent ends an operation
// within its timeout and breaks the group for later calls; a rendezvous
// missing a rank times out. Each test makes its own group (no backend
// matrix: this is gloo's failure handling, worker/comm/gloo).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/kv_store.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace baton {
namespace {

// A peer that disappears mid-collective must surface as an error on the
// others within the timeout, and break the group for later calls.
TEST(CommunicatorFailureTest, DeadPeerFailsWithinTimeoutAndBreaksGroup) {
  KeyValueStore kv;
  std::unique_ptr<Communicator> comms[2];
  std::thread t0([&] { comms[0] = *CreateGlooCommunicator(&kv, "dead/", 0, 2, GlooOptions{}); });
  std::thread t1([&] { comms[1] = *CreateGlooCommunicator(&kv, "dead/", 1, 2, GlooOptions{}); });
  t0.join();
  t1.join();
  ASSERT_TRUE(comms[0] && comms[1]);
  comms[1].reset();  // rank 1 leaves: its sockets close
  at::Tensor t = at::full({1024}, 1.0f);
  absl::Time start = absl::Now();
  absl::Status s = comms[0]->AllReduce(t, ReduceOp::kSum, Milliseconds(2000));
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("dead peer detected after %.3f s: %s\n", seconds, s.ToString().c_str());
  EXPECT_FALSE(s.ok());
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(comms[0]->AllReduce(t, ReduceOp::kSum).code(), absl::StatusCode::kFailedPrecondition);
}

// The all-gather runs its own transfers on gloo's contexts (gloo/process_group.h):
// a peer that is gone, or alive but never joining, ends it within its timeout.
TEST(CommunicatorFailureTest, AllGatherWithAGoneOrSilentPeerEndsWithinTimeout) {
  for (const bool gone : {true, false}) {
    KeyValueStore kv;
    const std::string prefix = gone ? "gone/" : "silent/";
    std::unique_ptr<Communicator> comms[2];
    std::thread t0([&] { comms[0] = *CreateGlooCommunicator(&kv, prefix, 0, 2, GlooOptions{}); });
    std::thread t1([&] { comms[1] = *CreateGlooCommunicator(&kv, prefix, 1, 2, GlooOptions{}); });
    t0.join();
    t1.join();
    ASSERT_TRUE(comms[0] && comms[1]);
    if (gone) comms[1].reset();
    at::Tensor in = at::full({1024}, 1.0f), out = at::empty({2048});
    absl::Time start = absl::Now();
    absl::Status s = comms[0]->AllGather(in, out, Milliseconds(1000));
    double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("all-gather with a %s peer ended after %.3f s: %s\n", gone ? "gone" : "silent", seconds,
                s.ToString().c_str());
    EXPECT_FALSE(s.ok());
    EXPECT_LT(seconds, 4.0);
    EXPECT_EQ(comms[0]->AllGather(in, out).code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(CommunicatorFailureTest, RendezvousWithAMissingRankTimesOut) {
  KeyValueStore kv;
  GlooOptions options;
  options.rendezvous_timeout = Milliseconds(500);
  absl::Time start = absl::Now();
  auto c = CreateGlooCommunicator(&kv, "lonely/", 0, 2, options);
  EXPECT_FALSE(c.ok());
  std::printf("rendezvous without rank 1 failed after %.3f s: %s\n",
              absl::ToDoubleSeconds(absl::Now() - start), c.status().ToString().c_str());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace baton
