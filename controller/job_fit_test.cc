// Admission: a job's predicted per-rank memory, and where its ranks share a
// host their collectives' shared-memory segments, against each worker's
// share of its host.
#include "controller/job_fit.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

baton::v1::JobSpec DdpJob() {
  // Per-unit buckets: the largest all-reduce is one block's gradients, ~0.5 MB,
  // so the segments (~1.2 MB per rank) are a visible part of the need.
  auto job = ParseJobSpec(R"pb(model { mlp { d_model: 256 blocks: 4 } } mesh { name: "dp" size: 2 }
                               plan { mode: DDP bucket_bytes: 1 } optimizer { lr: 0.01 } data { batch_size: 8 }
                               steps: 1)pb",
                          false);
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

baton::v1::WorkerInfo Worker(const std::string& name, const std::string& host, int64_t memory) {
  baton::v1::WorkerInfo w;
  w.set_name(name);
  w.set_address(host + ":7000");
  w.set_memory_bytes(memory);
  w.set_cpu_cores(4);
  w.set_state(baton::v1::REGISTERED);
  return w;
}

TEST(JobFitTest, RanksSharingAHostAlsoNeedTheirSharedMemorySegments) {
  const baton::v1::JobSpec job = DdpJob();
  auto theory = ComputeTheory(job);
  ASSERT_TRUE(theory.ok()) << theory.status();
  const int64_t need = theory->memory_bytes, shared = theory->shared_memory_bytes;
  std::printf("per rank: %lld bytes predicted, %lld of shared-memory segments\n", (long long)need, (long long)shared);
  ASSERT_GT(shared, 1 << 20);
  // Enough for the process's growth, not for the segments beside it.
  const int64_t between = need + shared / 2;
  // Two hosts, a worker each: no shared memory between the ranks.
  const std::vector<baton::v1::WorkerInfo> apart = {Worker("a", "10.0.0.1", between), Worker("b", "10.0.0.2", between)};
  EXPECT_TRUE(CheckFits(job, *theory, apart, apart).ok());
  // One host, its memory halved between its two workers.
  const std::vector<baton::v1::WorkerInfo> together = {Worker("a", "10.0.0.1", 2 * between),
                                                        Worker("b", "10.0.0.1", 2 * between)};
  const absl::Status refused = CheckFits(job, *theory, together, together);
  std::printf("one host: %s\n", refused.ToString().c_str());
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.message(), "shared-memory segments")) << refused;
  const std::vector<baton::v1::WorkerInfo> roomy = {Worker("a", "10.0.0.1", 2 * (need + shared)),
                                                     Worker("b", "10.0.0.1", 2 * (need + shared))};
  EXPECT_TRUE(CheckFits(job, *theory, roomy, roomy).ok());
}

}  // namespace
}  // namespace baton
