// The fleet's side of the control plane: a collective check beside a
// running job, hostile ids, the dispatcher's bound on calls in flight.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/controller_service.h"
#include "controller/fleet_checks.h"
#include "controller/testing/harness.h"

namespace baton {
namespace {

using testing::ControllerHarness;
using testing::MlpJob;
using testing::SlowSteps;
using testing::WaitFor;
using testing::WorkersOf;

TEST(FleetTest, ACheckRunsOnFreeWorkersBesideARunningJob) {
  ControllerHarness h({});
  SlowSteps(h, absl::Milliseconds(20));
  auto job = h.jobs().Submit(MlpJob("busy", 1000));
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() >= 1; }));
  baton::v1::CheckCollectivesRequest req;
  auto* axis = req.mutable_spec()->add_axes();
  axis->set_name("dp");
  axis->set_size(2);
  req.set_numel(16);
  auto checked = RunFleetCheck(h.meshes(), h.events(), req, "check-1");
  ASSERT_TRUE(checked.ok()) << checked.status();
  std::printf("check on [%s] beside %s on [%s]: %s\n", absl::StrJoin(checked->mesh().worker_names(), ", ").c_str(),
              (*job)->id().c_str(), absl::StrJoin((*job)->status().workers(), ", ").c_str(),
              checked->passed() ? "passed" : "FAILED");
  EXPECT_TRUE(checked->passed());
  for (const auto& w : checked->mesh().worker_names()) EXPECT_EQ(WorkersOf((*job)->status()).count(w), 0u);
  EXPECT_EQ((*job)->state(), baton::v1::JOB_RUNNING);
  const int before = (*job)->step();
  ASSERT_TRUE(WaitFor([&] { return (*job)->step() > before + 2; }));
  // A job may take the idle mesh's workers.
  auto other = h.jobs().Create(MlpJob("next", 3), absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(other.ok()) << other.status();
  h.jobs().Stop((*job)->id(), "test over").IgnoreError();
}

TEST(ControllerServiceTest, HostileIdsAreRefusedWithABoundedMessage) {
  const std::string huge(15 << 20, '\0');
  const absl::Time start = absl::Now();
  const absl::Status s = CheckJobId(huge);
  std::printf("15 MiB id: %s in %.3f ms, message %zu bytes\n", absl::StatusCodeToString(s.code()).c_str(),
              absl::ToDoubleMilliseconds(absl::Now() - start), s.message().size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 512u);
  EXPECT_TRUE(absl::StrContains(s.message(), "(15728640 bytes)"));
  EXPECT_FALSE(CheckJobId("job-1\r\n\x1b[2J").ok());
  EXPECT_TRUE(CheckJobId("job-12-ab3f").ok());
}

TEST(DispatcherTest, CallsInFlightStayWithinTheBoundAndNoThreadIsStartedPerCall) {
  EventLog events;
  WorkerRegistry registry(absl::Seconds(10), &events);
  testing::FakeFleet fleet(64, &registry);
  testing::FakeScript slow;
  slow.step_delay = absl::Milliseconds(20);
  Dispatcher bounded(fleet.stubs(), 8);
  auto threads = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "Threads:")) return std::stoi(line.substr(8));
    }
    return -1;
  };
  std::vector<WorkerTarget> addresses;
  for (int i = 0; i < 64; ++i) addresses.push_back({fleet.worker(i).name(), fleet.worker(i).address()});
  FanOut fan_out;
  fan_out.deadline = absl::Seconds(10);
  // GetInfo answers at once; every call must succeed within the bound. The
  // fakes' servers start their threads on a first fan-out; the second is
  // measured.
  bounded.Call<GetInfoRpc>(addresses, [](size_t) { return baton::v1::GetInfoRequest(); }, fan_out);
  const int before = threads();
  auto results = bounded.Call<GetInfoRpc>(addresses, [](size_t) { return baton::v1::GetInfoRequest(); }, fan_out);
  const int after = threads();
  int ok = 0;
  for (const auto& r : results) ok += r.status.ok();
  std::printf("64 calls, bound 8: %d OK, peak in flight %d; threads %d before, %d after\n", ok,
              bounded.peak_in_flight(), before, after);
  EXPECT_EQ(ok, 64);
  EXPECT_LE(bounded.peak_in_flight(), 8);
  EXPECT_LT(after - before, 16) << "threads grew with the calls";
}

}  // namespace
}  // namespace baton
