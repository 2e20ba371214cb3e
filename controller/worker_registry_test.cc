#include "controller/worker_registry.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace baton {
namespace {

baton::v1::WorkerInfo Worker(const std::string& name, const std::string& incarnation = "i1") {
  baton::v1::WorkerInfo w;
  w.set_name(name);
  w.set_address("127.0.0.1:1234");
  w.set_incarnation(incarnation);
  return w;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  EventLog events_;
  WorkerRegistry registry_{absl::Seconds(3), &events_, [this] { return now_; }};
};

TEST_F(WorkerRegistryTest, RanksFollowRegistrationOrderAndSurviveRestarts) {
  EXPECT_EQ(*registry_.Register(Worker("w-a")), 0);
  EXPECT_EQ(*registry_.Register(Worker("w-b")), 1);
  // Another instance under a live name is refused; once the first is dead
  // (no heartbeat for longer than the timeout) it takes the same slot.
  auto hijack = registry_.Register(Worker("w-a", "i2"));
  std::printf("live name re-registered: %s\n", hijack.status().ToString().c_str());
  EXPECT_TRUE(absl::IsFailedPrecondition(hijack.status()));
  EXPECT_EQ(*registry_.Register(Worker("w-a", "i1")), 0);  // the same instance again: fine
  now_ += absl::Seconds(4);
  registry_.Heartbeat("w-b", "i1");
  registry_.SweepDead();
  EXPECT_EQ(*registry_.Register(Worker("w-a", "i2")), 0);  // restarted: same slot
  auto list = registry_.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name(), "w-a");
  EXPECT_EQ(list[0].incarnation(), "i2");
  EXPECT_EQ(list[1].state(), baton::v1::REGISTERED);
}

TEST_F(WorkerRegistryTest, OrdinalNamesGetTheirOwnRank) {
  EXPECT_EQ(*registry_.Register(Worker("worker-2")), 2);
  EXPECT_EQ(*registry_.Register(Worker("worker-0")), 0);
  EXPECT_EQ(*registry_.Register(Worker("gpu-node")), 1);   // lowest free
  EXPECT_EQ(*registry_.Register(Worker("other-2")), 3);    // 2 is taken
  auto list = registry_.List();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].name(), "worker-0");
  EXPECT_EQ(list[2].name(), "worker-2");
}

TEST_F(WorkerRegistryTest, MissedHeartbeatsMakeAWorkerDeadThenItMayRejoin) {
  ASSERT_TRUE(registry_.Register(Worker("w-a")).ok());
  ASSERT_TRUE(registry_.Register(Worker("w-b")).ok());
  now_ += absl::Seconds(2);
  EXPECT_TRUE(registry_.Heartbeat("w-a", "i1"));
  now_ += absl::Seconds(2);  // w-b silent for 4 s > 3 s, w-a for 2 s
  auto dead = registry_.SweepDead();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0], "w-b");
  EXPECT_EQ(registry_.Get("w-b")->state(), baton::v1::DEAD);
  EXPECT_NEAR(registry_.Get("w-b")->heartbeat_age_s(), 4.0, 1e-9);
  EXPECT_TRUE(registry_.SweepDead().empty());  // reported once
  // A dead worker's heartbeat is refused: it must register again.
  EXPECT_FALSE(registry_.Heartbeat("w-b", "i1"));
  registry_.SetState({"w-b"}, baton::v1::CONFIGURED);
  EXPECT_EQ(registry_.Get("w-b")->state(), baton::v1::DEAD);  // DEAD stays DEAD
  EXPECT_EQ(*registry_.Register(Worker("w-b", "i2")), 1);
  EXPECT_EQ(registry_.Get("w-b")->state(), baton::v1::REGISTERED);
}

// What Register does when a new instance finds its name alive and the old
// address refuses connections: the old instance is DEAD at once (only if it
// is still the one at that address), and the new one takes the name.
TEST_F(WorkerRegistryTest, AGoneInstanceIsDeclaredDeadAndItsSuccessorTakesTheName) {
  ASSERT_TRUE(registry_.Register(Worker("w-a", "old")).ok());
  EXPECT_FALSE(registry_.Register(Worker("w-a", "new")).ok()) << "alive: not anyone's for the asking";
  EXPECT_FALSE(registry_.DeclareDead("w-a", "10.0.0.9:1", "elsewhere")) << "another address: not that instance";
  EXPECT_TRUE(registry_.DeclareDead("w-a", "127.0.0.1:1234", "its address refuses connections"));
  EXPECT_FALSE(registry_.DeclareDead("w-a", "127.0.0.1:1234", "again")) << "once";
  EXPECT_EQ(registry_.Get("w-a")->state(), baton::v1::DEAD);
  EXPECT_TRUE(registry_.SweepDead().empty()) << "not reported twice";
  ASSERT_TRUE(registry_.Register(Worker("w-a", "new")).ok());
  EXPECT_EQ(registry_.Get("w-a")->state(), baton::v1::REGISTERED);
  EXPECT_EQ(registry_.Get("w-a")->restarts(), 1);
}

TEST_F(WorkerRegistryTest, HeartbeatOfAnotherIncarnationIsRefused) {
  ASSERT_TRUE(registry_.Register(Worker("w-a", "new")).ok());
  EXPECT_FALSE(registry_.Heartbeat("w-a", "old"));
  EXPECT_FALSE(registry_.Heartbeat("nobody", "x"));
}

TEST_F(WorkerRegistryTest, RejectsMalformedWorkers) {
  EXPECT_EQ(registry_.Register(Worker("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.Register(Worker("bad name")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto w = Worker("ok");
  w.set_address("no-port");
  EXPECT_EQ(registry_.Register(w).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry_.List().empty());
}

TEST_F(WorkerRegistryTest, EventsRecordTheLifecycle) {
  ASSERT_TRUE(registry_.Register(Worker("w-a")).ok());
  now_ += absl::Seconds(5);
  registry_.SweepDead();
  ASSERT_TRUE(registry_.Register(Worker("w-a", "i2")).ok());
  auto events = events_.After(0, absl::ZeroDuration());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind(), baton::v1::Event::WORKER_REGISTERED);
  EXPECT_EQ(events[1].kind(), baton::v1::Event::WORKER_DEAD);
  EXPECT_EQ(events[1].worker(), "w-a");
  EXPECT_TRUE(absl::StrContains(events[1].cause(), "no heartbeat for 5.0 s")) << events[1].cause();
  EXPECT_EQ(events[2].kind(), baton::v1::Event::WORKER_REJOINED);
}

}  // namespace
}  // namespace baton
