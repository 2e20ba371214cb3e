// What a job leaves on disk: checkpoint directories checked at submission,
// saves that fail in a row, the job table read back after a controller
// restart, ids and epochs that never repeat.
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
using testing::HarnessOptions;
using testing::MlpJob;
using testing::SlowSteps;
using testing::TempDir;
using testing::WaitFor;

TEST(JobManagerTest, ACheckpointDirOutsideTheRootIsRefusedAtSubmit) {
  HarnessOptions options;
  options.jobs.checkpoints.file_root = TempDir("root");
  ControllerHarness h(options);
  for (const std::string dir : {"/etc/baton-ckpt", "../escape", "/nonexistent-root/ckpt"}) {
    auto job = h.jobs().Submit(MlpJob("ckpt", 3, absl::StrCat("mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                               "checkpoint { dir: \"", dir, "\" every_n_steps: 1 }")));
    std::printf("checkpoint.dir %s: %s\n", dir.c_str(), job.status().ToString().c_str());
    EXPECT_FALSE(job.ok());
    EXPECT_TRUE(absl::StrContains(job.status().message(), dir)) << job.status();
  }
  EXPECT_EQ(h.worker(0).configures(), 0) << "no worker was touched";
  EXPECT_TRUE(h.jobs().Jobs().empty());
}

TEST(JobManagerTest, SavesThatFailInARowFailTheJobNamingTheCause) {
  HarnessOptions options;
  options.jobs.checkpoints.file_root = TempDir("root");
  ControllerHarness h(options);
  testing::FakeScript full;
  full.fail_saves = true;
  for (int i = 0; i < 4; ++i) h.worker(i).set_script(full);
  auto job = h.jobs().Submit(MlpJob("full", 20, "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } "
                                                "checkpoint { dir: \"ckpt\" every_n_steps: 2 max_failures: 2 }"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  int errors = 0;
  for (const auto& e : (*job)->log().After(0)) errors += e.entry_case() == baton::v1::JobLogEntry::kCheckpointError;
  std::printf("%s at step %d after %d failed saves: %s\n", baton::v1::JobState_Name((*job)->state()).c_str(),
              (*job)->step(), errors, (*job)->status().error().c_str());
  EXPECT_EQ((*job)->state(), baton::v1::JOB_FAILED);
  EXPECT_EQ((*job)->step(), 4);
  EXPECT_EQ(errors, 2);
  EXPECT_TRUE(absl::StrContains((*job)->status().error(), "No space left on device"));
  // Nothing is left of the failed saves.
  std::ifstream probe(absl::StrCat(options.jobs.checkpoints.file_root, "/ckpt/step-00000002"));
  EXPECT_FALSE(probe.good()) << "the failed save's step directory is still there";
}

TEST(JobStoreTest, AJobTableReadBackAfterARestartResumesDetachedAndFailsAttached) {
  HarnessOptions options;
  options.state_dir = TempDir("state");
  std::string detached, attached, finished;
  int steps_before = 0;
  {
    ControllerHarness h(options);
    SlowSteps(h, absl::Milliseconds(30));
    auto done = h.jobs().Submit(MlpJob("done", 2));
    ASSERT_TRUE(WaitFor([&] { return (*done)->ended(); }));
    auto d = h.jobs().Submit(MlpJob("detached", 1000));
    auto a = h.jobs().Create(MlpJob("attached", 100), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(d.ok() && a.ok());
    ASSERT_TRUE(WaitFor([&] { return (*d)->step() >= 3; }));
    steps_before = (*d)->step();
    detached = (*d)->id();
    attached = (*a)->id();
    finished = (*done)->id();
  }  // the controller goes away, leaving its table
  ControllerHarness h(options);
  auto d = h.jobs().Find(detached);
  auto a = h.jobs().Find(attached);
  auto f = h.jobs().Find(finished);
  ASSERT_TRUE(d.ok() && a.ok() && f.ok());
  // Placed again (and, its steps being quick, maybe already done).
  ASSERT_TRUE(WaitFor([&] { return (*d)->state() == baton::v1::JOB_RUNNING || (*d)->ended(); }));
  int logged_steps = 0;
  for (const auto& e : (*f)->log().After(0)) logged_steps += e.has_step();
  std::printf("after the restart: %s %s (resumes %d, ran %d steps before), %s %s: %s; %s %s with %d logged steps\n",
              detached.c_str(), baton::v1::JobState_Name((*d)->state()).c_str(), (*d)->status().resumes(), steps_before,
              attached.c_str(), baton::v1::JobState_Name((*a)->state()).c_str(), (*a)->status().error().c_str(),
              finished.c_str(), baton::v1::JobState_Name((*f)->state()).c_str(), logged_steps);
  EXPECT_EQ((*d)->status().resumes(), 1);
  EXPECT_EQ((*a)->state(), baton::v1::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains((*a)->status().error(), "the controller restarted"));
  EXPECT_EQ((*f)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ(logged_steps, 2);
  EXPECT_EQ(h.EventsOf(baton::v1::Event::JOB_REQUEUED).size(), 1u);
  auto next = h.jobs().Submit(MlpJob("next", 1));
  ASSERT_TRUE(next.ok());
  std::printf("ids before the restart: %s %s %s; after: %s\n", finished.c_str(), detached.c_str(), attached.c_str(),
              (*next)->id().c_str());
  for (const auto& id : {finished, detached, attached}) EXPECT_NE((*next)->id(), id);
  h.jobs().Stop(detached, "test over").IgnoreError();
}

TEST(JobStoreTest, IdsAndEpochsNeverRepeatAcrossRestarts) {
  const std::string dir = TempDir("ids");
  std::set<std::string> ids;
  std::set<int64_t> epochs;
  for (int start = 0; start < 3; ++start) {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(ids.insert((*store)->NewJobId()).second);
      EXPECT_TRUE(epochs.insert((*store)->NewEpoch()).second);
    }
  }
  auto a = JobStore::InMemory(), b = JobStore::InMemory();
  const std::string ia = a->NewJobId(), ib = b->NewJobId();
  const int64_t ea = a->NewEpoch();
  absl::SleepFor(absl::Milliseconds(2));
  const int64_t eb = b->NewEpoch();
  std::printf("persisted ids %s; in memory %s and %s, epochs %lld < %lld\n", absl::StrJoin(ids, ",").c_str(), ia.c_str(),
              ib.c_str(), static_cast<long long>(ea), static_cast<long long>(eb));
  EXPECT_EQ(ids.size(), 9u);
  EXPECT_EQ(*ids.begin(), "job-1");
  EXPECT_NE(ia, ib);
  EXPECT_LT(ea, eb);
}

}  // namespace
}  // namespace baton
