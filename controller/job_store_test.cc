// What a job leaves on disk: checkpoint directories checked at submission,
// saves that fail in a row, the job table read back after a controller
// restart, ids and epochs that never repeat.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
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
      EXPECT_TRUE(ids.insert((*store)->NewJobId().value()).second);
      EXPECT_TRUE(epochs.insert((*store)->NewEpoch()).second);
    }
  }
  auto a = JobStore::InMemory(), b = JobStore::InMemory();
  const std::string ia = a->NewJobId().value(), ib = b->NewJobId().value();
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

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool AllEnded(ControllerHarness& h) {
  for (const auto& job : h.jobs().Jobs()) {
    if (!job->ended()) return false;
  }
  return true;
}

TEST(JobStoreTest, ALostOrDamagedCounterFileRepeatsNoId) {
  HarnessOptions options;
  options.state_dir = TempDir("counters");
  std::set<std::string> ids, before;
  {
    ControllerHarness h(options);
    for (int i = 0; i < 3; ++i) {
      auto job = h.jobs().Submit(MlpJob("before", 1));
      ASSERT_TRUE(job.ok()) << job.status();
      ids.insert((*job)->id());
    }
    ASSERT_TRUE(WaitFor([&] { return AllEnded(h); }));
  }
  before = ids;
  const std::string counters = options.state_dir + "/controller.pb";
  for (const std::string damage : {"truncated to 2 bytes", "overwritten with garbage", "deleted"}) {
    if (damage == "deleted") {
      ASSERT_EQ(::unlink(counters.c_str()), 0);
    } else if (damage == "truncated to 2 bytes") {
      ASSERT_EQ(::truncate(counters.c_str(), 2), 0);
    } else {
      std::ofstream(counters, std::ios::binary | std::ios::trunc) << "\xff\xff\xff not a ControllerState";
    }
    ControllerHarness h(options);
    auto next = h.jobs().Submit(MlpJob("after", 1));
    ASSERT_TRUE(next.ok()) << next.status();
    int listed = 0;
    for (const auto& id : before) listed += h.jobs().Find(id).ok();
    std::printf("controller.pb %s: the next job is %s (used before: %s); %d of %zu earlier jobs listed\n",
                damage.c_str(), (*next)->id().c_str(), absl::StrJoin(ids, ",").c_str(), listed, before.size());
    EXPECT_TRUE(ids.insert((*next)->id()).second) << (*next)->id() << " was handed out before";
    EXPECT_EQ(listed, static_cast<int>(before.size()));
    ASSERT_TRUE(WaitFor([&] { return AllEnded(h); }));
  }
}

TEST(JobStoreTest, AFullStateDirRefusesWhatItCannotRecordAndLosesNothingAcknowledged) {
  const std::string dir = TempDir("full-state");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=512k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << strerror(errno) << "; needs root)";
  }
  HarnessOptions options;
  options.state_dir = dir;
  std::vector<std::string> acknowledged;
  std::string refusal;
  int refused = 0;
  {
    ControllerHarness h(options);
    SlowSteps(h, absl::Milliseconds(20));
    // All but 48 KiB taken: a handful of records fit, then the disk is full.
    struct statvfs fs;
    ASSERT_EQ(::statvfs(dir.c_str(), &fs), 0);
    const int64_t fill = static_cast<int64_t>(fs.f_bavail) * fs.f_frsize - (48 << 10);
    {
      std::ofstream filler(dir + "/filler", std::ios::binary);
      filler << std::string(std::max<int64_t>(fill, 0), 'x');
    }
    for (int i = 0; i < 60; ++i) {
      auto job = h.jobs().Submit(MlpJob(absl::StrCat("fill-", i), 100000));
      if (job.ok()) {
        acknowledged.push_back((*job)->id());
      } else {
        ++refused;
        refusal = job.status().ToString();
      }
    }
  }  // the controller goes away; the disk is still full
  int listed = 0;
  std::string more, stop_error;
  {
    ControllerHarness h(options);
    for (const auto& id : acknowledged) listed += h.jobs().Find(id).ok();
    auto again = h.jobs().Submit(MlpJob("more", 1));
    more = again.ok() ? absl::StrCat("accepted as ", (*again)->id()) : again.status().ToString();
    // A change the table cannot record reaches the client that made it.
    for (const auto& id : acknowledged) {
      auto stopped = h.jobs().Stop(id, "test over");
      if (stopped.ok() && stop_error.empty()) stop_error = stopped->record_error();
    }
  }
  ::umount2(dir.c_str(), MNT_DETACH);
  std::printf("60 submissions on a full --state_dir: %zu acknowledged, %d refused (%s); after a restart on the "
              "still-full disk %d of the %zu acknowledged are listed; one more: %s; stopping one: %s\n",
              acknowledged.size(), refused, refusal.c_str(), listed, acknowledged.size(), more.c_str(),
              stop_error.c_str());
  EXPECT_GE(acknowledged.size(), 1u);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(acknowledged.size() + refused, 60u);
  EXPECT_TRUE(absl::StrContains(refusal, "No space left on device")) << refusal;
  EXPECT_EQ(listed, static_cast<int>(acknowledged.size()));
  EXPECT_TRUE(absl::StrContains(more, "No space left on device")) << more;
  EXPECT_TRUE(absl::StrContains(stop_error, "No space left on device")) << stop_error;
}

TEST(JobStoreTest, AnUnreadableRecordStaysListedAndItsFileIsKept) {
  HarnessOptions options;
  options.state_dir = TempDir("unreadable");
  std::string id;
  {
    ControllerHarness h(options);
    auto job = h.jobs().Submit(MlpJob("damaged", 1));
    ASSERT_TRUE(job.ok()) << job.status();
    id = (*job)->id();
    ASSERT_TRUE(WaitFor([&] { return (*job)->ended(); }));
  }
  const std::string path = absl::StrCat(options.state_dir, "/jobs/", id, ".pb");
  const std::string damage = "\x0a\xff\xff\xff\xff not a JobRecord";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << damage;
  ControllerHarness h(options);
  auto job = h.jobs().Find(id);
  ASSERT_TRUE(job.ok()) << "the job vanished from the table";
  auto next = h.jobs().Submit(MlpJob("next", 1));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(WaitFor([&] { return (*next)->ended(); }));
  std::printf("%s with a damaged record: %s: %s; the next job is %s; the file %s\n", id.c_str(),
              baton::v1::JobState_Name((*job)->state()).c_str(), (*job)->status().error().c_str(),
              (*next)->id().c_str(), Contents(path) == damage ? "is as it was" : "CHANGED");
  EXPECT_EQ((*job)->state(), baton::v1::JOB_UNREADABLE);
  EXPECT_TRUE(absl::StrContains((*job)->status().error(), path)) << (*job)->status().error();
  EXPECT_NE((*next)->id(), id);
  EXPECT_EQ(Contents(path), damage);
}

}  // namespace
}  // namespace baton
