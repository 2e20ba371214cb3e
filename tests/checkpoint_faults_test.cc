// Sharded checkpoints under faults, end to end through the controller with
// the SDK (baton::Job): a worker SIGKILLed mid-save leaves the previous
// checkpoint, an async save lets steps go on, a flipped byte fails the load
// naming file and tensor, a job whose newest checkpoint lost its files or
// holds a damaged byte recovers from its next older one, and bad input is
// refused with the fleet still usable. Real binaries on loopback, hard timeouts, nothing left behind.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <random>
#include <set>

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

// The losses of a job's steps, from its log (a step run twice: the later).
std::map<int, double> Losses(Client& client, const std::string& job) {
  std::map<int, double> losses;
  client.Logs(job, 0, /*follow=*/false, [&](const baton::v1::JobLogEntry& e) {
    if (e.has_step()) losses[e.step().step()] = e.step().loss();
    return true;
  }).IgnoreError();
  return losses;
}

// A detached job checkpointing every 5 steps loses a worker just after a
// save; that newest checkpoint has lost its data files, or one byte of it is
// flipped. The job recovers from its next older checkpoint (the missing
// files seen before any worker reads, the flipped byte when a worker
// reads it) and finishes, every loss equal to an uninterrupted run's.
void NewestCheckpointDamagedThenAWorkerKilled(bool flip_a_byte) {
  auto fleet = CheckpointFleet(3);
  ASSERT_NE(fleet, nullptr);
  auto client = ConnectTo(*fleet);
  constexpr int kSteps = 80;
  auto submit = [&](const std::string& dir) {
    baton::v1::CreateJobRequest req;
    *req.mutable_job() = FsdpDecoder(2, kSteps);
    req.mutable_job()->set_name(dir);
    req.mutable_job()->mutable_checkpoint()->set_dir(dir);
    req.mutable_job()->mutable_checkpoint()->set_every_n_steps(5);
    req.mutable_job()->mutable_restart()->set_replacement_timeout_ms(100);
    auto created = client->Submit(req);
    return created.ok() ? created->job().job_id() : std::string();
  };
  auto await_end = [&](const std::string& id) {
    const absl::Time until = absl::Now() + absl::Seconds(120);
    absl::StatusOr<baton::v1::JobStatus> s;
    do {
      absl::SleepFor(absl::Milliseconds(20));
      s = client->GetJob(id);
    } while (s.ok() && s->state() != baton::v1::JOB_FINISHED && s->state() != baton::v1::JOB_FAILED &&
             absl::Now() < until);
    return s;
  };
  const std::string straight = submit(flip_a_byte ? "straight_flip" : "straight_gone");
  ASSERT_FALSE(straight.empty());
  ASSERT_TRUE(await_end(straight).ok());
  const std::map<int, double> uninterrupted = Losses(*client, straight);
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kSteps));

  const std::string job = submit(flip_a_byte ? "flipped" : "gone");
  ASSERT_FALSE(job.empty());
  // Just after a save past step 10 is published.
  absl::StatusOr<baton::v1::JobStatus> s;
  int seen = -1;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < until) {
    s = client->GetJob(job);
    if (!s.ok()) break;
    const int published = s->last_checkpoint().step();
    if (published >= 10 && seen >= 0 && published != seen) break;
    seen = published;
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string newest = s->last_checkpoint().path();
  const int damaged = s->last_checkpoint().step();
  ASSERT_GE(damaged, 10) << "no save was published in time";
  auto md = ReadMetadata(newest);
  ASSERT_TRUE(md.ok()) << md.status();
  std::string what;
  if (flip_a_byte) {
    const baton::v1::CheckpointChunk& chunk = md->tensors(0).chunks(0);
    const std::string file = absl::StrCat(newest, "/", chunk.file());
    const int fd = ::open(file.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char b;
    const off_t at = chunk.byte_offset() + chunk.length() / 2;
    ASSERT_EQ(::pread(fd, &b, 1, at), 1);
    b ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
    what = absl::StrCat("byte ", at, " of ", chunk.file(), " flipped");
  } else {
    std::set<std::string> files;
    for (const auto& t : md->tensors()) {
      for (const auto& c : t.chunks()) files.insert(c.file());
    }
    for (const auto& f : files) ASSERT_EQ(::unlink(absl::StrCat(newest, "/", f).c_str()), 0);
    what = absl::StrCat(files.size(), " data files deleted");
  }
  const std::string victim = s->workers(0);
  ASSERT_EQ(kill(testing::PidOf(*fleet, victim), SIGKILL), 0);
  auto end = await_end(job);
  ASSERT_TRUE(end.ok()) << end.status();
  const std::map<int, double> losses = Losses(*client, job);
  int identical = 0;
  for (const auto& [step, loss] : losses) identical += uninterrupted.count(step) && uninterrupted.at(step) == loss;
  std::printf("%s: step %d's checkpoint (%s), then %s SIGKILLed: %s after %d restart(s), resumed from step %d (%s); "
              "%d of %zu losses equal to the uninterrupted run's\n",
              job.c_str(), damaged, what.c_str(), victim.c_str(), baton::v1::JobState_Name(end->state()).c_str(),
              end->restarts(), end->start_step(), end->restored().path().c_str(), identical, losses.size());
  EXPECT_EQ(end->state(), baton::v1::JOB_FINISHED) << end->error();
  EXPECT_EQ(end->start_step(), damaged - 5);
  EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(identical, kSteps);
  StopAndExpectAllGone(*fleet);
}

TEST(CheckpointTest, NewestCheckpointLostItsFilesRecoversFromTheOlderOne) {
  NewestCheckpointDamagedThenAWorkerKilled(/*flip_a_byte=*/false);
}

TEST(CheckpointTest, NewestCheckpointHoldsAFlippedByteRecoversFromTheOlderOne) {
  NewestCheckpointDamagedThenAWorkerKilled(/*flip_a_byte=*/true);
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
