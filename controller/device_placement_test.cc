// Jobs go only to workers of the device kind their job file asks for
// (JobSpec.device; a worker's kind is its --device), on fake fleets: a mixed
// fleet runs a CUDA job and a CPU job side by side, each on its own kind; a
// job no worker of its kind can take is refused (attached) or waits
// (detached) saying so; a CUDA job takes NCCL and refuses gloo.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "controller/testing/harness.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

using testing::ControllerHarness;
using testing::HarnessOptions;
using testing::InState;
using testing::MlpJob;
using testing::SlowSteps;
using testing::WaitFor;
using testing::WorkersOf;

HarnessOptions Fleet(std::vector<std::string> devices) {
  HarnessOptions options;
  options.workers = static_cast<int>(devices.size());
  options.devices = std::move(devices);
  return options;
}

baton::v1::CreateJobRequest CudaJob(const std::string& name, int steps,
                                    const std::string& extra = "mesh { name: \"dp\" size: 2 } plan { mode: FSDP }") {
  baton::v1::CreateJobRequest req = MlpJob(name, steps, extra);
  req.mutable_job()->set_device(baton::v1::CUDA);
  return req;
}

TEST(DevicePlacementTest, AMixedFleetRunsEachJobOnItsKind) {
  // Fleet order interleaves the kinds: first-free placement would mix them.
  ControllerHarness h(Fleet({"cuda:0", "cpu", "cuda:1", ""}));
  SlowSteps(h, absl::Milliseconds(100));
  auto gpu = h.jobs().Submit(CudaJob("gpu", 10));
  auto cpu = h.jobs().Submit(MlpJob("cpu", 10));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(WaitFor([&] { return InState(*gpu, baton::v1::JOB_RUNNING) && InState(*cpu, baton::v1::JOB_RUNNING); }));
  const auto on_gpu = WorkersOf((*gpu)->status()), on_cpu = WorkersOf((*cpu)->status());
  std::printf("CUDA job on [%s] (backend %s), CPU job on [%s]\n", absl::StrJoin(on_gpu, ",").c_str(),
              baton::v1::CommBackend_Name((*gpu)->status().backend()).c_str(), absl::StrJoin(on_cpu, ",").c_str());
  EXPECT_EQ(on_gpu, (std::set<std::string>{"fake-0", "fake-2"}));
  EXPECT_EQ(on_cpu, (std::set<std::string>{"fake-1", "fake-3"}));  // "" is a CPU worker (said nothing)
  EXPECT_EQ((*gpu)->status().backend(), baton::v1::NCCL);
  ASSERT_TRUE(WaitFor([&] { return (*gpu)->ended() && (*cpu)->ended(); }));
  EXPECT_EQ((*gpu)->state(), baton::v1::JOB_FINISHED) << (*gpu)->status().error();
  EXPECT_EQ((*cpu)->state(), baton::v1::JOB_FINISHED) << (*cpu)->status().error();
}

TEST(DevicePlacementTest, NoWorkerOfItsKindRefusesOrQueuesSayingSo) {
  ControllerHarness h(Fleet({"cpu", "cpu", "cpu", "cpu"}));
  auto attached = h.jobs().Create(CudaJob("gpu", 5), absl::Now() + absl::Seconds(5));
  std::printf("attached CUDA job on a CPU fleet: %s\n", attached.status().ToString().c_str());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(attached.status().message(), "needs 2 CUDA workers but 0 of 4 registered are free "
                                                             "CUDA workers"))
      << attached.status();
  EXPECT_TRUE(absl::StrContains(attached.status().message(), "4 free of another device kind")) << attached.status();
  auto detached = h.jobs().Submit(CudaJob("gpu-queued", 5));
  ASSERT_TRUE(detached.ok()) << detached.status();
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains((*detached)->status().waiting_for(), "CUDA workers"); }));
  std::printf("detached: %s, waiting for: %s\n", baton::v1::JobState_Name((*detached)->state()).c_str(),
              (*detached)->status().waiting_for().c_str());
  EXPECT_EQ((*detached)->state(), baton::v1::JOB_PENDING);
  // Each kind has its own line: a CPU job behind it is not held back.
  auto cpu = h.jobs().Submit(MlpJob("cpu-behind", 3));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(WaitFor([&] { return (*cpu)->ended(); }));
  std::printf("CPU job behind it: %s after %d steps; the CUDA job still %s\n",
              baton::v1::JobState_Name((*cpu)->state()).c_str(), (*cpu)->step(),
              baton::v1::JobState_Name((*detached)->state()).c_str());
  EXPECT_EQ((*cpu)->state(), baton::v1::JOB_FINISHED) << (*cpu)->status().error();
  EXPECT_EQ((*detached)->state(), baton::v1::JOB_PENDING);
}

TEST(DevicePlacementTest, ANamedWorkerOfAnotherKindIsRefused) {
  ControllerHarness h(Fleet({"cpu", "cuda:0"}));
  auto job = h.jobs().Create(CudaJob("gpu", 5, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                "workers: \"fake-1\" workers: \"fake-0\""),
                             absl::Now() + absl::Seconds(5));
  std::printf("named: %s\n", job.status().ToString().c_str());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(job.status().message(), "worker fake-0 computes on cpu, not on a CUDA device"))
      << job.status();
}

TEST(DevicePlacementTest, ACudaJobRefusesGlooAndCpuJobsRefuseTf32) {
  ControllerHarness h(Fleet({"cuda:0", "cuda:1"}));
  baton::v1::CreateJobRequest gloo = CudaJob("gpu", 5);
  gloo.set_backend(baton::v1::GLOO);
  auto refused = h.jobs().Create(gloo, absl::Now() + absl::Seconds(5));
  std::printf("CUDA on gloo: %s\n", refused.status().ToString().c_str());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "nccl")) << refused.status();
  // Ring attention posts a send before its receive on every rank: on NCCL's
  // one stream that is a circle of waits, refused before any worker is
  // touched (as 1F1B's is).
  baton::v1::CreateJobRequest cp;
  auto spec = ParseJobSpec(R"(name: "cp" device: CUDA steps: 5
      model { decoder { vocab: 256 dim: 64 layers: 2 heads: 8 seq_len: 64 mlp: GELU ffn_dim: 128 } }
      mesh { name: "cp" size: 2 } plan { mode: FSDP context_parallel { axis: "cp" } }
      optimizer { lr: 0.003 } data { synthetic {} batch_size: 4 })",
                           false);
  ASSERT_TRUE(spec.ok()) << spec.status();
  *cp.mutable_job() = *spec;
  auto ring = h.jobs().Create(cp, absl::Now() + absl::Seconds(5));
  std::printf("CUDA job with context parallelism: %s\n", ring.status().ToString().c_str());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(ring.status().message(), "context parallelism")) << ring.status();
  baton::v1::CreateJobRequest tf32 = MlpJob("cpu-tf32", 5);
  tf32.mutable_job()->set_allow_tf32(true);
  auto no_tf32 = h.jobs().Create(tf32, absl::Now() + absl::Seconds(5));
  std::printf("CPU job with allow_tf32: %s\n", no_tf32.status().ToString().c_str());
  EXPECT_EQ(no_tf32.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
