// JobTrace: armed for N steps, recorded from the calls that follow, started
// over when steps do not follow (a restore at an earlier step, another
// mesh), shared by the clients that ask meanwhile, and never waited for
// forever.
#include "controller/job_trace.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "absl/time/clock.h"

namespace baton {
namespace {

// One call's answers: `ranks` ranks, steps first .. first + k - 1.
std::vector<baton::v1::RunStepResponse> Call(int ranks, int first, int k) {
  std::vector<baton::v1::RunStepResponse> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < k; ++i) out[r].add_traces()->set_step(first + i);
  }
  return out;
}

std::vector<const baton::v1::RunStepResponse*> Ptrs(const std::vector<baton::v1::RunStepResponse>& v) {
  std::vector<const baton::v1::RunStepResponse*> out;
  for (const auto& r : v) out.push_back(&r);
  return out;
}

baton::v1::Mesh MeshOfEpoch(int epoch) {
  baton::v1::Mesh m;
  m.set_epoch(epoch);
  return m;
}

TEST(JobTraceTest, RecordsTheArmedStepsFromTheCallsThatFollow) {
  JobTrace trace;
  EXPECT_FALSE(trace.Wants(1)) << "nothing armed";
  trace.Arm(5);
  ASSERT_TRUE(trace.Wants(4));
  auto plan = std::make_shared<JobPlan>();
  trace.Collect(MeshOfEpoch(1), plan, 4, Ptrs(Call(2, 4, 3)));   // steps 4-6
  EXPECT_TRUE(trace.Wants(7));
  EXPECT_FALSE(trace.Wants(9)) << "past the armed steps";
  trace.Collect(MeshOfEpoch(1), plan, 7, Ptrs(Call(2, 7, 3)));   // 7-9: two of them taken
  EXPECT_FALSE(trace.Wants(10)) << "recorded";
  auto recorded = trace.Await(absl::Now() + absl::Seconds(1), [] { return std::string(); });
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  std::printf("recorded steps %d..%d on %zu ranks\n", recorded->first_step,
              recorded->first_step + recorded->steps - 1, recorded->by_rank.size());
  EXPECT_EQ(recorded->first_step, 4);
  EXPECT_EQ(recorded->steps, 5);
  ASSERT_EQ(recorded->by_rank.size(), 2u);
  ASSERT_EQ(recorded->by_rank[1].size(), 5u);
  EXPECT_EQ(recorded->by_rank[1].back().step(), 8);
}

TEST(JobTraceTest, StepsThatDoNotFollowStartItOver) {
  JobTrace trace;
  trace.Arm(4);
  auto plan = std::make_shared<JobPlan>();
  trace.Collect(MeshOfEpoch(1), plan, 10, Ptrs(Call(2, 10, 2)));
  // Restored at step 8 on another mesh (fewer ranks): from there.
  ASSERT_TRUE(trace.Wants(8));
  trace.Collect(MeshOfEpoch(2), plan, 8, Ptrs(Call(1, 8, 4)));
  auto recorded = trace.Await(absl::Now() + absl::Seconds(1), [] { return std::string(); });
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(recorded->first_step, 8);
  EXPECT_EQ(recorded->mesh.epoch(), 2);
  EXPECT_EQ(recorded->by_rank.size(), 1u);
  // A call where a rank did not record is not taken.
  trace.Arm(2);
  auto mixed = Call(2, 12, 2);
  mixed[1].clear_traces();
  trace.Collect(MeshOfEpoch(2), plan, 12, Ptrs(mixed));
  EXPECT_TRUE(trace.Wants(14));
}

TEST(JobTraceTest, AClientThatArmsMeanwhileSharesItAndNobodyWaitsForever) {
  JobTrace trace;
  trace.Arm(3);
  trace.Arm(50);  // another client: the armed one is kept
  auto plan = std::make_shared<JobPlan>();
  trace.Collect(MeshOfEpoch(1), plan, 1, Ptrs(Call(1, 1, 3)));
  trace.Arm(50);  // recorded, not yet taken: kept too
  auto recorded = trace.Await(absl::Now() + absl::Seconds(1), [] { return std::string(); });
  ASSERT_TRUE(recorded.ok());
  EXPECT_EQ(recorded->steps, 3);
  // Taken: the next arm is a new trace, and a job that steps no more times out.
  trace.Arm(2);
  const absl::Time began = absl::Now();
  auto timed_out = trace.Await(absl::Now() + absl::Milliseconds(300), [] { return std::string(); });
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded) << timed_out.status();
  std::printf("no step: %s after %.2f s\n", timed_out.status().ToString().c_str(),
              absl::ToDoubleSeconds(absl::Now() - began));
  // A job that ends meanwhile ends the wait at once.
  trace.Arm(2);
  auto gone = trace.Await(absl::Now() + absl::Seconds(30), [] { return std::string("job j-1 is JOB_STOPPED"); });
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition) << gone.status();
  EXPECT_NE(gone.status().message().find("JOB_STOPPED"), std::string::npos);
}

}  // namespace
}  // namespace baton
