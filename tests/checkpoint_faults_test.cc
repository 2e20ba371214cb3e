// Sharded checkpoints under faults, end to end through the controller with
// the SDK (baton::Job): a worker SIGKILLed mid-save leaves the previous
// checkpoint, an async save lets steps go on, a flipped byte fails the load
// naming file and tensor, and bad input is refused with the fleet still
// usable. Real binaries on loopback, hard timeouts, nothing left behind.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "client/client.h"
#include "client/job.h"
#include "common/file_root.h"
#include "strategies/job_spec.h"
#include "tests/checkpoint_fleet.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"

namespace baton {
namespace {

using testing::CheckpointFleet;
using testing::CheckpointRoot;
using testing::ConnectTo;
using testing::FsdpDecoder;
using testing::RunCommand;
using testing::StopAndExpectAllGone;

// A worker SIGKILLed while an async save writes: the partial checkpoint is
// invisible, the previous one loads (ten times over, each round resuming
// the survivor of the last).
TEST(CheckpointTest, KilledMidSaveLeavesThePreviousCheckpoint) {
  std::mt19937 rng(42);
  int invisible = 0, killed_midway = 0, loadable = 0;
  const int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    // Each piece written costs 25 ms: a save of 57 pieces per rank takes
    // ~1.4 s, the kill comes 0.05-0.6 s into it.
    auto fleet = CheckpointFleet(2, {"--testing_write_delay_ms=25"});
    ASSERT_NE(fleet, nullptr);
    auto client = ConnectTo(*fleet);
    auto job = round == 0 ? Job::Create(client.get(), FsdpDecoder(2, 40)) : Job::Restore(client.get(), FsdpDecoder(2, 40), "atomic");
    ASSERT_TRUE(job.ok()) << "round " << round << ": " << job.status();
    loadable += round > 0;
    ASSERT_EQ((*job)->step(), round);  // the last round's save that survived
    ASSERT_TRUE((*job)->Step(1).ok());
    auto good = (*job)->Save("atomic");
    ASSERT_TRUE(good.ok()) << good.status();
    ASSERT_TRUE((*job)->Step(1).ok());
    auto partial = (*job)->Save("atomic", /*async=*/true);
    ASSERT_TRUE(partial.ok()) << partial.status();
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(50, 600)(rng)));
    ASSERT_EQ(kill(testing::PidOf(*fleet, "worker-1"), SIGKILL), 0);
    auto waited = (*job)->WaitForSave();
    auto found = FindCheckpoint(absl::StrCat(CheckpointRoot(), "/atomic"));
    ASSERT_TRUE(found.ok()) << found.status();
    killed_midway += !waited.ok();
    invisible += !waited.ok() && absl::EndsWith(*found, StepDirName(good->step()));
    auto md = ReadMetadata(*found);
    ASSERT_TRUE(md.ok());
    EXPECT_TRUE(VerifyCheckpoint(*found, *md).ok());
    std::printf("round %d: killed worker-1 during the save of step %d (%s); newest checkpoint %s\n", round,
                partial->step(), waited.ok() ? "it finished first" : std::string(waited.status().message()).substr(0, 70).c_str(),
                found->substr(found->rfind('/') + 1).c_str());
    StopAndExpectAllGone(*fleet);
  }
  std::printf("%d of %d saves killed midway (of %d rounds) stayed invisible; the previous checkpoint loaded %d of %d "
              "times\n", invisible, killed_midway, kRounds, loadable, kRounds - 1);
  EXPECT_EQ(invisible, killed_midway);
  EXPECT_GE(killed_midway, kRounds / 2) << "most kills should land during the save";
  EXPECT_EQ(loadable, kRounds - 1);
}

TEST(CheckpointTest, AsyncSaveLetsStepsGoOn) {
  // 30 ms per piece written: the save (~1.7 s) outlasts three steps on a slow machine too.
  auto fleet = CheckpointFleet(2, {"--testing_write_delay_ms=30"});
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  auto job = Job::Create(client.get(), FsdpDecoder(2, 20));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(2).ok());
  const absl::Time start = absl::Now();
  auto async = (*job)->Save("async", /*async=*/true);
  ASSERT_TRUE(async.ok()) << async.status();
  auto during = (*job)->Step(3);
  ASSERT_TRUE(during.ok()) << during.status();
  const int in_flight_after_steps = (*job)->status().checkpoint_in_flight_step();
  const double steps_done_s = absl::ToDoubleSeconds(absl::Now() - start);
  auto published = (*job)->WaitForSave();
  ASSERT_TRUE(published.ok()) << published.status();
  std::printf("async save of step %d: copied in %.3f s; 3 steps done %.3f s after it began, with the save still in "
              "flight (in-flight step %d); published after %.3f s\n",
              async->step(), async->copy_seconds(), steps_done_s, in_flight_after_steps, published->seconds());
  EXPECT_EQ(in_flight_after_steps, 2);
  EXPECT_EQ(published->step(), 2);
  EXPECT_EQ((*job)->status().checkpoint_in_flight_step(), 0);
  auto md = ReadMetadata(published->path());
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_TRUE(VerifyCheckpoint(published->path(), *md).ok());
  // The saved state is step 2's: resuming from it repeats steps 3..5 exactly.
  ASSERT_TRUE((*job)->Stop().ok());
  auto resumed = Job::Restore(client.get(), FsdpDecoder(2, 20), published->path());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  auto again = (*resumed)->Step(3);
  ASSERT_TRUE(again.ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*again)[i].loss(), (*during)[i].loss()) << "step " << 3 + i;
  StopAndExpectAllGone(*fleet);
}

TEST(CheckpointTest, FlippedByteFailsTheLoadNamingFileAndTensor) {
  auto fleet = CheckpointFleet(2);
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  auto job = Job::Create(client.get(), FsdpDecoder(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(1).ok());
  auto saved = (*job)->Save("corrupt");
  ASSERT_TRUE(saved.ok());
  ASSERT_TRUE((*job)->Stop().ok());
  auto md = ReadMetadata(saved->path());
  ASSERT_TRUE(md.ok());
  // A byte in the middle of the biggest chunk of rank 1's file.
  const baton::v1::CheckpointTensor* victim = nullptr;
  const baton::v1::CheckpointChunk* chunk = nullptr;
  for (const auto& t : md->tensors()) {
    for (const auto& c : t.chunks()) {
      if (absl::StartsWith(c.file(), "rank-00001") && (chunk == nullptr || c.length() > chunk->length())) {
        victim = &t;
        chunk = &c;
      }
    }
  }
  ASSERT_NE(chunk, nullptr);
  const std::string file = absl::StrCat(saved->path(), "/", chunk->file());
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b;
  const off_t at = chunk->byte_offset() + chunk->length() / 2;
  ASSERT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::close(fd);
  auto loaded = Job::Restore(client.get(), FsdpDecoder(2), saved->path());
  ASSERT_FALSE(loaded.ok());
  std::printf("load after flipping byte %lld of %s: %s\n", static_cast<long long>(at), chunk->file().c_str(),
              loaded.status().ToString().c_str());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), file));
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), victim->name()));
  // Nothing half-loaded: the fleet trains the next job.
  auto next = Job::Create(client.get(), FsdpDecoder(2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Step(1).ok());
  StopAndExpectAllGone(*fleet);
}

TEST(CheckpointTest, BadInputIsRefusedAndTheFleetStaysUsable) {
  auto fleet = CheckpointFleet(2);
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  auto job = Job::Create(client.get(), FsdpDecoder(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Step(1).ok());
  auto saved = (*job)->Save("bad/good");
  ASSERT_TRUE(saved.ok());
  auto outside = (*job)->Save("/tmp/baton-escape");
  auto dotdot = (*job)->Save("../escape");
  ASSERT_TRUE((*job)->Stop().ok());
  ASSERT_TRUE(MakeDirs(CheckpointRoot() + "/bad/foreign").ok());
  { std::FILE* f = std::fopen((CheckpointRoot() + "/bad/foreign/notes.txt").c_str(), "w"); std::fputs("hi", f); std::fclose(f); }
  auto mlp = ParseJobSpec(R"pb(
    model { mlp { d_model: 16 blocks: 2 } } mesh { name: "dp" size: 2 } plan { mode: FSDP }
    optimizer { lr: 0.01 } data { batch_size: 8 } steps: 4
  )pb", false);
  ASSERT_TRUE(mlp.ok());
  // Same model family, another width: the export fits no piece of it.
  ASSERT_EQ(RunCommand({testing::BatonBinary(), "checkpoint", "export", saved->path(), CheckpointRoot() + "/bad/w40.safetensors"},
                       absl::Seconds(30)).exit_code, 0);
  baton::v1::JobSpec wider = FsdpDecoder(2);
  wider.mutable_model()->mutable_decoder()->set_dim(48);
  wider.set_init_from("bad/w40.safetensors");
  baton::v1::JobSpec shadow = FsdpDecoder(2);
  shadow.mutable_data()->mutable_token_file()->set_path("/etc/passwd");
  shadow.mutable_data()->mutable_token_file()->set_format(baton::v1::TokenFile::UINT16);
  const std::vector<std::pair<std::string, absl::Status>> cases = {
      {"save to an absolute path outside the root", outside.status()},
      {"save to ../escape", dotdot.status()},
      {"resume from a missing directory", Job::Restore(client.get(), FsdpDecoder(2), "bad/missing").status()},
      {"resume from a foreign directory", Job::Restore(client.get(), FsdpDecoder(2), "bad/foreign").status()},
      {"resume from /etc", Job::Restore(client.get(), FsdpDecoder(2), "/etc").status()},
      {"resume a model from another's checkpoint", Job::Restore(client.get(), *mlp, "bad/good").status()},
      {"init_from weights whose shapes do not fit", Job::Create(client.get(), wider).status()},
      {"a token file outside the data root", Job::Create(client.get(), shadow).status()},
  };
  for (const auto& [what, status] : cases) {
    std::printf("%-44s -> %s\n", what.c_str(), status.ToString().substr(0, 150).c_str());
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_FALSE(absl::StrContains(status.message(), "terminate")) << what;
  }
  EXPECT_TRUE(absl::IsPermissionDenied(cases[0].second));
  EXPECT_TRUE(absl::IsPermissionDenied(cases[1].second));
  EXPECT_TRUE(absl::IsNotFound(cases[2].second));
  EXPECT_TRUE(absl::IsNotFound(cases[3].second));
  EXPECT_TRUE(absl::IsPermissionDenied(cases[4].second));
  EXPECT_TRUE(absl::StrContains(cases[5].second.message(), "another model"));
  EXPECT_TRUE(absl::StrContains(cases[6].second.message(), "shape"));
  EXPECT_TRUE(absl::StrContains(cases[7].second.message(), "outside the file root")) << cases[7].second;
  auto next = Job::Create(client.get(), FsdpDecoder(2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Step(2).ok());
  StopAndExpectAllGone(*fleet);
}

}  // namespace
}  // namespace baton
