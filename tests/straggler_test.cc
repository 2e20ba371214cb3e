// Slow ranks named (issue 49), through real daemons: worker-2 computes 25 %
// slower (--testing_slow_compute, a test-only flag). A dp=4 FSDP job, a
// dp=2 x tp=2 job and a pp=2 x dp=2 1F1B job each name it, with its rank and
// factor, from the ranks' own compute times (their waits excluded: the slow
// rank's time shows up as the others' waits); the same jobs on a fleet
// without a slow worker name nobody in 1,000 steps each. With EVICT the dp=4
// job moves off worker-2 onto the other three (its state restored worker to
// worker, nothing from disk), grows back onto its four, and its losses equal
// a reference resumed from checkpoints at the same steps on the same meshes
// (<= 1e-5).
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <utility>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

constexpr char kSlowFlag[] = "--testing_slow_compute=worker-2=0.25";

struct Case {
  const char* name;
  const char* example;
};
const Case kCases[] = {
    {"dp=4 FSDP", "examples/decoder_fsdp4.textproto"},
    {"dp=2 x tp=2", "examples/decoder_fsdp_tp.textproto"},
    {"pp=2 x dp=2 1F1B", "examples/decoder_pp2_fsdp2.textproto"},
};

// A step of tens of milliseconds: windows of 20 steps span about a second,
// longer than the moments a busy host takes a core from one rank.
std::string Heavier(std::string text) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"dim: 64", "dim: 192"},
                                 {"ffn_dim: 256", "ffn_dim: 768"}}) {
    if (auto at = text.find(from); at != std::string::npos) text.replace(at, from.size(), to);
  }
  return text;
}

baton::v1::CreateJobRequest Job(const Case& c, int steps, const std::string& extra,
                                const std::string& batch = "") {
  std::string text = Heavier(testing::ReadFile(testing::Runfile(c.example)));
  if (!batch.empty()) {
    const std::string b = "batch_size: 16";
    text.replace(text.find(b), b.size(), batch);
  }
  auto spec = ParseJobSpec(absl::StrCat(text, "\n", extra), false);
  EXPECT_TRUE(spec.ok()) << spec.status();
  baton::v1::CreateJobRequest req;
  if (spec.ok()) *req.mutable_job() = *spec;
  req.mutable_job()->set_steps(steps);
  return req;
}

// Waits until `cond` holds for the job's status (or `timeout`); the last
// status. It asks 4 times a second: the test compares ranks' compute times
// on 2 cores, and its own polling is load on them (at 50 a second, a clean
// 1F1B rank was now and then 1.21x its peers over 20 steps).
baton::v1::JobStatus Await(Client& client, const std::string& job,
                           const std::function<bool(const baton::v1::JobStatus&)>& cond, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  baton::v1::JobStatus s;
  while (absl::Now() < until) {
    if (auto j = client.GetJob(job); j.ok()) s = *j;
    if (cond(s)) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  return s;
}

bool Ended(const baton::v1::JobStatus& s) {
  return s.state() == baton::v1::JOB_FINISHED || s.state() == baton::v1::JOB_FAILED ||
         s.state() == baton::v1::JOB_STOPPED;
}

// Submits `req` and waits until the job ended (or `timeout`); its status then.
baton::v1::JobStatus RunToEnd(Client& client, const baton::v1::CreateJobRequest& req, absl::Duration timeout) {
  auto submitted = client.Submit(req);
  if (!submitted.ok()) {
    ADD_FAILURE() << submitted.status();
    return baton::v1::JobStatus();
  }
  return Await(client, submitted->job().job_id(), Ended, timeout);
}

TEST(StragglerTest, ASlowWorkerIsNamedOnEveryKindOfMesh) {
  auto cluster = testing::StartCluster(4, {}, {kSlowFlag});
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok()) << client.status();
  for (const Case& c : kCases) {
    const baton::v1::JobStatus s = RunToEnd(**client, Job(c, 60, "straggler { action: REPORT }"), absl::Minutes(3));
    ASSERT_EQ(s.state(), baton::v1::JOB_FINISHED) << c.name << ": " << s.error();
    ASSERT_GE(s.stragglers_size(), 1) << c.name << ": nobody named";
    const baton::v1::Straggler& first = s.stragglers(0);
    std::printf("%s: %s (rank %d) named at step %d, %.3fx its peers' compute over 20 steps; %d named in all\n", c.name,
                first.worker().c_str(), first.rank(), first.step(), first.factor(), s.stragglers_size());
    EXPECT_EQ(first.worker(), "worker-2") << c.name;
    EXPECT_GE(first.rank(), 0) << c.name;
    EXPECT_LT(first.rank(), 4) << c.name;
    EXPECT_GT(first.factor(), 1.2) << c.name;
    // Its first full window is step 20: named within 20 steps of it.
    EXPECT_LE(first.step(), 40) << c.name;
    for (const auto& other : s.stragglers()) EXPECT_EQ(other.worker(), "worker-2") << c.name;
  }
  testing::StopAndExpectAllGone(*cluster);
}

TEST(StragglerTest, CleanStepsNameNobody) {
  auto cluster = testing::StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok()) << client.status();
  for (const Case& c : kCases) {
    const absl::Time started = absl::Now();
    const baton::v1::JobStatus s = RunToEnd(**client, Job(c, 1000, "straggler { action: REPORT }"), absl::Minutes(10));
    std::string reports;
    for (const auto& r : s.stragglers()) absl::StrAppend(&reports, "; ", r.worker(), " ", r.factor(), "x at step ", r.step());
    std::printf("%s: %d clean steps in %.0f s: %d reports%s\n", c.name, s.step(),
                absl::ToDoubleSeconds(absl::Now() - started), s.stragglers_size(), reports.c_str());
    EXPECT_EQ(s.state(), baton::v1::JOB_FINISHED) << c.name << ": " << s.error();
    EXPECT_EQ(s.step(), 1000) << c.name;
    EXPECT_EQ(s.stragglers_size(), 0) << c.name;
  }
  testing::StopAndExpectAllGone(*cluster);
}

// A job's losses by step, from its log.
std::map<int, double> Losses(Client& client, const std::string& job) {
  std::map<int, double> losses;
  const absl::Status read = client.Logs(
      job, 0, /*follow=*/false,
      [&losses](const baton::v1::JobLogEntry& e) {
        if (e.has_step() && e.step().has_loss()) losses[e.step().step()] = e.step().loss();
        return true;
      },
      absl::Seconds(30));
  EXPECT_TRUE(read.ok()) << read;
  return losses;
}

TEST(StragglerTest, EvictMovesTheJobOffTheSlowWorkerAndItGrowsBack) {
  const std::string root = ::testing::TempDir() + "/evict_root";
  std::filesystem::create_directories(root);
  auto cluster = testing::StartCluster(4, {"--checkpoint_root=" + root}, {kSlowFlag, "--checkpoint_root=" + root});
  ASSERT_NE(cluster, nullptr);
  auto client = Client::Connect(cluster->controller_address());
  ASSERT_TRUE(client.ok()) << client.status();
  // A batch of 24 splits over 3 replicas: the job goes on with dp=3.
  auto submitted = (*client)->Submit(Job(kCases[0], 3000,
                                         "restart { min_workers: 3 backoff_ms: 100 } "
                                         "straggler { action: EVICT evict_ms: 5000 }",
                                         "batch_size: 24"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().job_id();
  const baton::v1::JobStatus on3 = Await(
      **client, id, [](const auto& s) { return Ended(s) || (s.state() == baton::v1::JOB_RUNNING && s.workers_size() == 3); },
      absl::Minutes(3));
  ASSERT_EQ(on3.workers_size(), 3) << on3.error();
  const absl::Time moved = absl::Now();
  const baton::v1::JobStatus on4 = Await(
      **client, id, [](const auto& s) { return Ended(s) || (s.state() == baton::v1::JOB_RUNNING && s.workers_size() == 4); },
      absl::Minutes(3));
  const double back_after = absl::ToDoubleSeconds(absl::Now() - moved);
  // Some steps on the four again, then enough seen.
  Await(**client, id, [&on4](const auto& s) { return Ended(s) || s.step() >= on4.start_step() + 10; }, absl::Minutes(1));
  (*client)->StopJob(id).IgnoreError();
  const baton::v1::JobStatus end = Await(**client, id, Ended, absl::Minutes(2));
  ASSERT_GE(end.stragglers_size(), 1);
  const baton::v1::Straggler& first = end.stragglers(0);
  std::printf("named %s (rank %d) at step %d, %.3fx; went on with [%s] from step %d (%lld B from peers, %lld B in "
              "place, %lld B from disk); back on [%s] %.1f s later from step %d (%lld B from disk); %d restarts\n",
              first.worker().c_str(), first.rank(), first.step(), first.factor(),
              absl::StrJoin(on3.workers(), ",").c_str(), on3.start_step(),
              static_cast<long long>(on3.restored().bytes_from_peers()),
              static_cast<long long>(on3.restored().bytes_local()),
              static_cast<long long>(on3.restored().bytes()), absl::StrJoin(on4.workers(), ",").c_str(),
              back_after, on4.start_step(), static_cast<long long>(on4.restored().bytes()), end.restarts());
  EXPECT_EQ(first.worker(), "worker-2");
  EXPECT_TRUE(first.evicted());
  for (const auto& w : on3.workers()) EXPECT_NE(w, "worker-2");
  EXPECT_GE(on3.start_step(), first.step());
  EXPECT_EQ(on3.restored().bytes(), 0) << "its state moved worker to worker";
  ASSERT_EQ(on4.workers_size(), 4) << on4.error();
  EXPECT_GE(back_after, 3.0) << "kept off worker-2 for evict_ms";
  EXPECT_EQ(on4.restored().bytes(), 0);
  EXPECT_EQ(end.restarts(), 0) << "an eviction is no failure";

  // Its losses against a reference resumed at the same steps on the same
  // meshes: dp=4 to the eviction, dp=3 from its checkpoint to the grow-back,
  // dp=4 again from that one to the end (what the job's state went through,
  // moved worker to worker instead of through disk).
  const std::map<int, double> evicted = Losses(**client, id);
  auto reference = [&](int dp, int steps, const std::string& dir, const std::string& resume) {
    std::string extra = absl::StrCat("checkpoint { dir: \"", dir, "\" every_n_steps: ", steps, " }");
    if (!resume.empty()) absl::StrAppend(&extra, " resume_from: \"", resume, "\"");
    baton::v1::CreateJobRequest req = Job(kCases[0], steps, extra, "batch_size: 24");
    req.mutable_job()->mutable_mesh(0)->set_size(dp);
    auto submitted = (*client)->Submit(req);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return std::map<int, double>();
    const baton::v1::JobStatus s = Await(**client, submitted->job().job_id(), Ended, absl::Minutes(3));
    EXPECT_EQ(s.state(), baton::v1::JOB_FINISHED) << s.error();
    return Losses(**client, submitted->job().job_id());
  };
  std::map<int, double> expected = reference(4, on3.start_step(), "ref4", "");
  for (const auto& [step, loss] : reference(3, on4.start_step(), "ref3", "ref4")) expected[step] = loss;
  for (const auto& [step, loss] : reference(4, end.step(), "ref4_again", "ref3")) expected[step] = loss;
  const auto [worst, compared] = testing::CompareLosses(evicted, expected);
  std::printf("evicted job: %d steps (dp=4 to %d, dp=3 to %d, dp=4 to %d) against a reference resumed from "
              "checkpoints at the same steps on the same meshes: worst relative loss difference %.3g\n",
              compared, on3.start_step(), on4.start_step(), end.step(), worst);
  EXPECT_EQ(compared, end.step());
  EXPECT_LE(worst, 1e-5);
  testing::StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
