// StepLedger alone: what a client asks is counted after the steps recorded
// and on the wire, capped at the job's end; a withdrawal keeps what started;
// a detached job asks for every step once placed; settling never goes back.
#include "controller/step_ledger.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace baton {
namespace {

TEST(StepLedgerTest, AClientsAskCountsAfterWhatIsRecordedAndOnTheWire) {
  StepLedger ledger(/*step=*/4, /*steps=*/10, /*detached=*/false);
  EXPECT_FALSE(ledger.has_work(4));
  EXPECT_EQ(ledger.Request(2, CallSettings{}, 4), 6);
  ledger.Start(2);                                               // steps 5 and 6 on the wire
  const int wait_for = ledger.Request(3, CallSettings{}, 4);  // after them: 7, 8, 9
  ledger.Recorded();                                             // step 5
  const int capped = ledger.Request(100, CallSettings{}, 5);
  std::printf("asked 2 at step 4: wait for 6; 3 more with 2 on the wire: wait for %d; 100 more: %d (job of 10)\n",
              wait_for, capped);
  EXPECT_EQ(wait_for, 9);
  EXPECT_EQ(capped, 10);
  // The client stops waiting: what has not started (7..10) is withdrawn,
  // step 6 (on the wire) stays asked.
  ledger.Withdraw(5);
  EXPECT_EQ(ledger.target(), 6);
  ledger.ClearRunning();  // the call failed: nothing on the wire any more
  ledger.Withdraw(5);
  EXPECT_EQ(ledger.target(), 5);
}

TEST(StepLedgerTest, ADetachedJobAsksForEveryStepOncePlacedAndKeepsThem) {
  StepLedger ledger(/*step=*/0, /*steps=*/7, /*detached=*/true);
  EXPECT_FALSE(ledger.has_work(0));  // nothing before it is placed
  ledger.Restart(3);                 // placed, restored at step 3
  EXPECT_EQ(ledger.target(), 7);
  EXPECT_TRUE(ledger.has_work(3));
  ledger.Withdraw(3);  // nobody waits on a detached job's steps
  EXPECT_EQ(ledger.target(), 7);
  EXPECT_TRUE(ledger.settled(3));
  EXPECT_FALSE(ledger.settled(4));
  ledger.Settle(5);
  ledger.Settle(4);  // never back
  std::printf("detached at 3 of 7: target %d, settled 5: %d, settled 6: %d\n", ledger.target(), ledger.settled(5),
              ledger.settled(6));
  EXPECT_TRUE(ledger.settled(5));
  EXPECT_FALSE(ledger.settled(6));
}

// A call's settings (its K, its collectives' timeout, its deadline) travel
// with its ask: the newest ask's are the ones the runner reads, and a
// negative K is the runner's choice (0).
TEST(StepLedgerTest, TheNewestAsksSettingsAreTheOnesRead) {
  StepLedger ledger(/*step=*/0, /*steps=*/10, /*detached=*/false);
  const absl::Time by = absl::FromUnixSeconds(1000);
  ledger.Request(1, CallSettings{4, 1500, by}, 0);
  EXPECT_EQ(ledger.settings().steps_per_call, 4);
  EXPECT_EQ(ledger.settings().collective_timeout_ms, 1500);
  EXPECT_EQ(ledger.settings().answer_by, by);
  ledger.Request(1, CallSettings{-3, 700, absl::InfiniteFuture()}, 0);
  std::printf("second ask: K %d, timeout %lld ms\n", ledger.settings().steps_per_call,
              static_cast<long long>(ledger.settings().collective_timeout_ms));
  EXPECT_EQ(ledger.settings().steps_per_call, 0);
  EXPECT_EQ(ledger.settings().collective_timeout_ms, 700);
  EXPECT_EQ(ledger.settings().answer_by, absl::InfiniteFuture());
}

}  // namespace
}  // namespace baton
