// What admission refuses so that nothing it acknowledges is lost or mixed up
// later (docs/control_plane.md, "What is refused"): a checkpoint.dir another
// live job saves to, a job no placement on the fleet could ever satisfy; and
// the queue around a job that waits for the workers it names (backfill).
// Whose checkpoints a restarting job may load: only its own.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/files.h"
#include "checkpoint/layout.h"
#include "common/file_root.h"
#include "controller/checkpoint_coordinator.h"
#include "controller/resume_points.h"
#include "controller/testing/harness.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

using testing::ControllerHarness;
using testing::HarnessOptions;
using testing::MlpJob;
using testing::SlowSteps;
using testing::TempDir;
using testing::WaitFor;
using testing::WorkersOf;

constexpr char kDp2[] = "mesh { name: \"dp\" size: 2 } plan { mode: FSDP } ";

TEST(AdmissionTest, ACheckpointDirThatALiveJobSavesToIsRefused) {
  HarnessOptions options;
  options.jobs.checkpoints.file_root = TempDir("root");
  ControllerHarness h(options);
  SlowSteps(h, absl::Milliseconds(20));
  const std::string shared = absl::StrCat(kDp2, "checkpoint { dir: \"shared\" every_n_steps: 50000 }");
  auto first = h.jobs().Submit(MlpJob("seed-7", 100000, shared));
  ASSERT_TRUE(first.ok()) << first.status();
  // The same file submitted twice, and the same directory spelled another way.
  auto twice = h.jobs().Submit(MlpJob("seed-7", 100000, shared));
  auto spelled = h.jobs().Submit(
      MlpJob("seed-9", 100000, absl::StrCat(kDp2, "checkpoint { dir: \"./shared/\" every_n_steps: 50000 }")));
  std::printf("while %s saves to shared: the same file again: %s; \"./shared/\": %s\n", (*first)->id().c_str(),
              twice.status().ToString().c_str(), spelled.status().ToString().c_str());
  for (const auto* refused : {&twice, &spelled}) {
    ASSERT_FALSE(refused->ok());
    EXPECT_EQ(refused->status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(refused->status().message(), (*first)->id())) << refused->status();
  }
  // Once it has ended the directory may be used again.
  ASSERT_TRUE(h.jobs().Stop((*first)->id(), "test").ok());
  ASSERT_TRUE(WaitFor([&] { return (*first)->ended(); }));
  auto after = h.jobs().Submit(MlpJob("seed-9", 10, shared));
  std::printf("after %s ended: %s\n", (*first)->id().c_str(), after.ok() ? "accepted" : after.status().ToString().c_str());
  EXPECT_TRUE(after.ok()) << after.status();
  if (after.ok()) ASSERT_TRUE(WaitFor([&] { return (*after)->ended(); }));
}

// A checkpoint directory with metadata only (no tensors): enough for whose
// it is and its step.
void FakeCheckpoint(const std::string& root, int step, const std::string& job_id, const std::string& fingerprint) {
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_block_bytes(1 << 20);
  md.set_step(step);
  md.set_job_id(job_id);
  md.set_job_fingerprint(fingerprint);
  const std::string dir = absl::StrFormat("%s/step-%08d", root, step);
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(PublishMetadata(dir, md).ok());
}

TEST(AdmissionTest, AJobResumesOnlyFromItsOwnCheckpointsNewestFirst) {
  const std::string root = TempDir("own");
  baton::v1::JobRecord mine;
  *mine.mutable_spec() = WithDefaults(
      MlpJob("seed-7", 100, absl::StrCat(kDp2, "seed: 7 checkpoint { dir: \"shared\" every_n_steps: 1 }")).job());
  mine.mutable_status()->set_job_id("job-7");
  baton::v1::JobSpec other = mine.spec();
  other.set_seed(9);
  const std::string fp = JobFingerprint(mine.spec()), other_fp = JobFingerprint(other);
  const std::string dir = root + "/shared";
  FakeCheckpoint(dir, 2, "job-7", fp);
  FakeCheckpoint(dir, 3, "job-7", fp);
  FakeCheckpoint(dir, 4, "job-9", other_fp);  // another job's, in the same directory
  FakeCheckpoint(dir, 6, "job-7", other_fp);  // a job-7 of another controller's table
  FakeCheckpoint(dir, 8, "", "");             // saved before checkpoints named their job
  auto names = [&](const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const auto& p : paths) out.push_back(p.substr(p.rfind('/') + 1));
    return absl::StrJoin(out, ",");
  };
  const std::string own = names(ResumePoints(mine, root, {}));
  // Its record names step 2, but step 3 was published after the record was
  // last written: the newer one first.
  mine.mutable_status()->mutable_last_checkpoint()->set_path(absl::StrFormat("%s/step-%08d", dir, 2));
  const std::string behind = names(ResumePoints(mine, root, {}));
  mine.mutable_status()->mutable_last_checkpoint()->set_path(absl::StrFormat("%s/step-%08d", dir, 8));
  const std::string recorded = names(ResumePoints(mine, root, {}));
  const std::string skipping =
      names(ResumePoints(mine, root, {{absl::StrFormat("%s/step-%08d", dir, 3), "damaged"}}));
  std::printf("job-7's resume points in a directory it shares: %s; with step 2 in its record: %s; with step 8 (no "
              "owner) in its record: %s; with step 3 unloadable: %s\n",
              own.c_str(), behind.c_str(), recorded.c_str(), skipping.c_str());
  EXPECT_EQ(own, "step-00000003,step-00000002");
  EXPECT_EQ(behind, "step-00000003,step-00000002");
  EXPECT_EQ(recorded, "step-00000008,step-00000003,step-00000002");
  EXPECT_EQ(skipping, "step-00000008,step-00000002");
  EXPECT_NE(fp, other_fp);
  // Rescaled (its record now holds dp=4): the same checkpoints are its own.
  mine.mutable_spec()->mutable_mesh(0)->set_size(4);
  mine.mutable_status()->clear_last_checkpoint();
  const std::string rescaled = names(ResumePoints(mine, root, {}));
  std::printf("after a rescale to dp=4: %s\n", rescaled.c_str());
  EXPECT_EQ(rescaled, "step-00000003,step-00000002");
  // Its record names a checkpoint that is gone, and none of its own is
  // left: said (the job then fails, never starting over from step 0).
  baton::v1::JobRecord orphan = mine;
  orphan.mutable_status()->set_job_id("job-8");
  orphan.mutable_status()->mutable_last_checkpoint()->set_path(root + "/gone/step-00000040");
  std::map<std::string, std::string> lost;
  const auto none = ResumePoints(orphan, root, {}, &lost);
  std::printf("job-8, whose recorded checkpoint is gone: %zu resume points; lost: %s\n", none.size(),
              lost.empty() ? "(nothing)" : lost.begin()->second.c_str());
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(lost.count(root + "/gone/step-00000040"), 1u);
}

TEST(AdmissionTest, WhatTheFleetCanNeverPlaceIsRefused) {
  HarnessOptions options;
  options.workers = 4;
  options.jobs.registration_grace = absl::ZeroDuration();
  ControllerHarness h(options);
  // While the fleet is still registering the same job is queued, not refused.
  {
    HarnessOptions fresh = options;
    fresh.jobs.registration_grace = absl::Minutes(1);
    ControllerHarness starting(fresh);
    auto queued = starting.jobs().Submit(MlpJob("early", 10, "mesh { name: \"dp\" size: 8 } plan { mode: FSDP }"));
    std::printf("8 workers on a fleet of 4 still registering: %s\n",
                queued.ok() ? absl::StrCat("queued as ", (*queued)->id()).c_str() : queued.status().ToString().c_str());
    EXPECT_TRUE(queued.ok()) << queued.status();
    if (queued.ok()) starting.jobs().Stop((*queued)->id(), "test").IgnoreError();
  }
  auto big = h.jobs().Submit(MlpJob("big", 10, "mesh { name: \"dp\" size: 8 } plan { mode: FSDP }"));
  auto ghost = h.jobs().Submit(MlpJob("ghost", 10, absl::StrCat(kDp2, "workers: \"fake-0\" workers: \"nope\"")));
  std::printf("8 workers on a fleet of 4: %s\nnaming an unregistered worker: %s\n", big.status().ToString().c_str(),
              ghost.status().ToString().c_str());
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(big.status().message(), "the fleet has 4 registered"));
  ASSERT_FALSE(ghost.ok());
  EXPECT_TRUE(absl::StrContains(ghost.status().message(), "\"nope\", which is not registered"));
  EXPECT_TRUE(h.jobs().Jobs().empty()) << "a refused job left a record";
}

TEST(AdmissionTest, AJobBehindOneWaitingForItsNamedWorkersStartsOnOthers) {
  HarnessOptions options;
  options.workers = 6;
  ControllerHarness h(options);
  SlowSteps(h, absl::Milliseconds(20));
  auto a = h.jobs().Submit(MlpJob("a", 100000, absl::StrCat(kDp2, "workers: \"fake-0\" workers: \"fake-1\"")));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(WaitFor([&] { return (*a)->state() == baton::v1::JOB_RUNNING; }));
  // b names fake-0, which a holds: it waits, and keeps fake-2 for itself.
  auto b = h.jobs().Submit(MlpJob("b", 100000, absl::StrCat(kDp2, "workers: \"fake-0\" workers: \"fake-2\"")));
  auto c = h.jobs().Submit(MlpJob("c", 100000));
  ASSERT_TRUE(b.ok() && c.ok());
  ASSERT_TRUE(WaitFor([&] { return (*c)->state() == baton::v1::JOB_RUNNING; }))
      << "c waits behind b: " << (*c)->status().waiting_for();
  const std::set<std::string> c_on = WorkersOf((*c)->status());
  std::printf("a on fake-0,1; b (fake-0,2) %s, waiting for: %s; c started on %s\n",
              baton::v1::JobState_Name((*b)->state()).c_str(), (*b)->status().waiting_for().c_str(),
              absl::StrJoin(c_on, ",").c_str());
  EXPECT_EQ((*b)->state(), baton::v1::JOB_PENDING);
  EXPECT_TRUE(absl::StrContains((*b)->status().waiting_for(), "fake-0")) << (*b)->status().waiting_for();
  EXPECT_FALSE(c_on.count("fake-2")) << "c took the worker b waits for";
  EXPECT_FALSE(c_on.count("fake-0"));
  // a ends: b starts at once on what it named.
  ASSERT_TRUE(h.jobs().Stop((*a)->id(), "test").ok());
  ASSERT_TRUE(WaitFor([&] { return (*b)->state() == baton::v1::JOB_RUNNING; })) << (*b)->status().waiting_for();
  EXPECT_EQ(WorkersOf((*b)->status()), (std::set<std::string>{"fake-0", "fake-2"}));
  for (const auto& job : {*b, *c}) h.jobs().Stop(job->id(), "test over").IgnoreError();
}

TEST(AdmissionTest, AJobWaitingForANumberOfWorkersHoldsTheLineAndSaysSo) {
  HarnessOptions options;
  options.workers = 4;
  ControllerHarness h(options);
  SlowSteps(h, absl::Milliseconds(20));
  auto a = h.jobs().Submit(MlpJob("a", 100000));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(WaitFor([&] { return (*a)->state() == baton::v1::JOB_RUNNING; }));
  auto four = h.jobs().Submit(MlpJob("four", 10, "mesh { name: \"dp\" size: 4 } plan { mode: FSDP }"));
  auto two = h.jobs().Submit(MlpJob("two", 10));
  ASSERT_TRUE(four.ok() && two.ok());
  ASSERT_TRUE(WaitFor([&] { return !(*two)->status().waiting_for().empty(); }));
  std::printf("four waits: %s\ntwo waits: %s\n", (*four)->status().waiting_for().c_str(),
              (*two)->status().waiting_for().c_str());
  // two would fit on the free pair, but it would take what four waits for.
  EXPECT_EQ((*two)->state(), baton::v1::JOB_PENDING);
  EXPECT_TRUE(absl::StrContains((*two)->status().waiting_for(), (*four)->id()));
  ASSERT_TRUE(h.jobs().Stop((*a)->id(), "test").ok());
  ASSERT_TRUE(WaitFor([&] { return (*two)->ended(); }, absl::Seconds(30)));
  EXPECT_EQ((*four)->state(), baton::v1::JOB_FINISHED);
  EXPECT_EQ((*two)->state(), baton::v1::JOB_FINISHED);
}

}  // namespace
}  // namespace baton
