// A controller that dies loses no step: `baton up` with a job table, the
// controller SIGKILLed at random moments (drawn from a printed seed) during
// detached jobs on 4 workers - FSDP dp=4, HSDP 2x2 and a pp=2 x dp=2 1F1B
// pipeline. Each time the new controller resumes the job from the state its
// workers kept (not from its checkpoint, which every job also saves): at
// most one step run again, nothing read from disk, its first step within 3 s
// of the new controller answering, and every step's loss bit-identical to an
// uninterrupted run's, each step logged.
//
// Then the controller and one worker together: the HSDP job takes the dead
// worker's shard from its replica (nothing from disk); the FSDP job's dead
// shard is in no live worker, and pieces of different steps never mix, so it
// restores whole from its last checkpoint. Both end bit-identical.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "proto/worker.grpc.pb.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"
#include "tests/up_fleet.h"

namespace baton {
namespace {

using testing::JsonLines;

struct Example {
  std::string file;  // under examples/
  int steps = 0;
};

// Long enough that no kill comes after the end (a step takes about 10 ms
// here; a kill and its resume take about 2 s, with the job running about
// 1 s of it).
const Example kFsdp{"decoder_fsdp4.textproto", 800};
const Example kHsdp{"decoder_hsdp.textproto", 800};
const Example kPipeline{"decoder_pp2_fsdp2.textproto", 800};
constexpr int kCheckpointEvery = 40;

class ControllerKills {
 public:
  ControllerKills() : fleet_(testing::StartUpFleet("controller-kills", 4)), seed_(testing::TestSeed()), rng_(seed_) {
    std::printf("seed %llu (BATON_TEST_SEED=%llu repeats these kill moments)\n",
                static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(seed_));
  }

  testing::UpFleet& fleet() { return fleet_; }

  std::string JobFile(const Example& e, const std::string& name) {
    return testing::WriteJobFile(fleet_.dir, e.file, name, e.steps,
                                 absl::StrCat("checkpoint { dir: \"", name, "\" every_n_steps: ", kCheckpointEvery,
                                              " }"));
  }

  // The losses of an uninterrupted run of `e`, every step.
  std::map<int, double> Uninterrupted(const Example& e) {
    const std::string id = fleet_.Submit(JobFile(e, absl::StrCat("straight-", Stem(e))));
    auto out = fleet_.Follow(id);
    EXPECT_EQ(out.exit_code, 0) << out.output;
    return testing::StepLosses(out.output);
  }

  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect(fleet_.addr, absl::Milliseconds(300));
    return c.ok() ? std::move(*c) : nullptr;
  }

  absl::StatusOr<baton::v1::JobStatus> Job(const std::string& id) {
    auto c = Connect();
    if (c == nullptr) return absl::UnavailableError("no controller");
    return c->GetJob(id);
  }

  // Waits until job `id` has run `n` steps (false past 120 s).
  bool AwaitStep(const std::string& id, int n) {
    const absl::Time until = absl::Now() + absl::Seconds(120);
    while (absl::Now() < until) {
      auto job = Job(id);
      if (job.ok() && job->step() >= n) return true;
      if (job.ok() && job->state() != baton::v1::JOB_RUNNING && job->state() != baton::v1::JOB_PENDING) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // A moment drawn from the seed: between 0.1 and 1 s after the job (re)started.
  absl::Duration DrawDelay() { return absl::Milliseconds(std::uniform_int_distribution<int>(100, 1000)(rng_)); }

  struct Resume {
    int killed_at = 0;     // the step the controller last reported before the kill
    double answer_s = 0;   // kill -> the new controller answers
    double first_step_s = 0;  // the new controller answers -> the job's first step
    baton::v1::CheckpointInfo restored;
    bool ok = false;
  };

  // SIGKILLs the controller (and `worker`, if named, at once) while `id`
  // runs; waits for the new one and for the job's first step on it.
  Resume Kill(const std::string& id, int resumes_before, const std::string& worker = "") {
    Resume r;
    auto before = Job(id);
    r.killed_at = before.ok() ? before->step() : -1;
    const pid_t controller = fleet_.CurrentPid("controller");
    const pid_t worker_pid = worker.empty() ? 0 : fleet_.CurrentPid(worker);
    if (controller <= 0 || (!worker.empty() && worker_pid <= 0)) return r;
    const absl::Time killed = absl::Now();
    kill(controller, SIGKILL);
    if (worker_pid > 0) kill(worker_pid, SIGKILL);
    std::unique_ptr<Client> c;
    while ((c = Connect()) == nullptr || !c->Status().ok()) {
      if (absl::Now() - killed > absl::Seconds(30)) return r;
      absl::SleepFor(absl::Milliseconds(10));
    }
    const absl::Time answered = absl::Now();
    r.answer_s = absl::ToDoubleSeconds(answered - killed);
    while (absl::Now() - answered < absl::Seconds(60)) {
      auto job = c->GetJob(id);
      if (job.ok() && job->resumes() > resumes_before && job->state() == baton::v1::JOB_RUNNING &&
          job->step() > job->start_step()) {
        r.first_step_s = absl::ToDoubleSeconds(absl::Now() - answered);
        r.restored = job->restored();
        r.ok = true;
        return r;
      }
      if (job.ok() && (job->state() == baton::v1::JOB_FAILED || job->state() == baton::v1::JOB_FINISHED)) break;
      absl::SleepFor(absl::Milliseconds(5));
      if (!job.ok()) c = Connect();
      if (c == nullptr) c = Connect();
      if (c == nullptr) absl::SleepFor(absl::Milliseconds(20));
    }
    return r;
  }

  // The job's log to its end; each step's loss compared with `straight`.
  void CompareToEnd(const std::string& id, const Example& e, const std::map<int, double>& straight,
                    const std::string& what) {
    auto out = fleet_.Follow(id);
    EXPECT_EQ(out.exit_code, 0) << out.output;
    std::map<int, int> times;
    for (const auto& line : JsonLines(out.output)) ++times[static_cast<int>(testing::Field(line, "step"))];
    const std::map<int, double> losses = testing::StepLosses(out.output);
    int identical = 0, twice = 0;
    for (const auto& [step, loss] : losses) identical += straight.count(step) && straight.at(step) == loss;
    for (const auto& [step, n] : times) twice += n > 1;
    std::printf("%s (%s): %zu of %d steps logged, %d logged more than once, %d losses bit-identical to the "
                "uninterrupted run; last step %d\n",
                what.c_str(), id.c_str(), losses.size(), e.steps, twice, identical,
                losses.empty() ? 0 : losses.rbegin()->first);
    EXPECT_EQ(losses.size(), static_cast<size_t>(e.steps));
    EXPECT_EQ(identical, e.steps);
  }

  // What the fleet's log says of `id`'s restores (why not from its workers).
  void PrintRestores(const std::string& id) {
    for (absl::string_view line : absl::StrSplit(fleet_.log(), '\n')) {
      if (absl::StrContains(line, "JOB_RESTORED") && absl::StrContains(line, absl::StrCat("job=", id, " "))) {
        std::printf("  %s\n", std::string(line).c_str());
      }
    }
  }

  static std::string Stem(const Example& e) { return e.file.substr(0, e.file.find('.')); }

 private:
  testing::UpFleet fleet_;
  uint64_t seed_;
  std::mt19937_64 rng_;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(ControllerKillTest, ADetachedJobResumesFromItsWorkersAfterEachControllerKill) {
  ControllerKills t;
  ASSERT_FALSE(t.fleet().addr.empty()) << t.fleet().log();
  // 10 kills over the three jobs.
  const std::vector<std::pair<Example, int>> plan = {{kFsdp, 4}, {kHsdp, 3}, {kPipeline, 3}};
  std::map<std::string, std::map<int, double>> straight;
  std::vector<double> first_steps;
  int kills = 0;
  for (const auto& [e, n] : plan) {
    straight[e.file] = t.Uninterrupted(e);
    ASSERT_EQ(straight[e.file].size(), static_cast<size_t>(e.steps)) << e.file;
    const std::string id = t.fleet().Submit(t.JobFile(e, absl::StrCat("killed-", ControllerKills::Stem(e))));
    ASSERT_FALSE(id.empty());
    ASSERT_TRUE(t.AwaitStep(id, 1)) << t.fleet().log();
    for (int k = 0; k < n; ++k) {
      absl::SleepFor(t.DrawDelay());
      const ControllerKills::Resume r = t.Kill(id, k);
      ++kills;
      ASSERT_TRUE(r.ok) << "kill " << kills << ": the job did not resume\n" << t.fleet().log();
      const baton::v1::CheckpointInfo& from = r.restored;
      std::printf("kill %d (%s, %s): at step %d; answering %.2f s later; resumed at step %d %s (%lld B in place, "
                  "%lld B from peers, %lld B from disk), %d steps redone, %d recorded from the workers' figures; "
                  "first step %.2f s after the new controller answered\n",
                  kills, ControllerKills::Stem(e).c_str(), id.c_str(), r.killed_at, r.answer_s, from.step(),
                  from.from_peers() ? "from its workers" : absl::StrCat("from ", from.path().empty() ? "scratch" : from.path()).c_str(),
                  static_cast<long long>(from.bytes_local()), static_cast<long long>(from.bytes_from_peers()),
                  static_cast<long long>(from.bytes()), from.steps_redone(), from.steps_recovered(), r.first_step_s);
      if (!from.from_peers()) t.PrintRestores(id);
      EXPECT_TRUE(from.from_peers());
      EXPECT_EQ(from.bytes(), 0);
      EXPECT_LE(from.steps_redone(), 1);
      EXPECT_GE(from.step(), r.killed_at - 1);
      EXPECT_LE(r.first_step_s, 3.0);
      first_steps.push_back(r.first_step_s);
    }
    t.CompareToEnd(id, e, straight[e.file], absl::StrCat(ControllerKills::Stem(e), " killed ", n, " times"));
  }
  std::printf("%d controller kills: first step after the new controller answered: median %.2f s, max %.2f s (limit "
              "3.0 s)\n",
              kills, Median(first_steps), *std::max_element(first_steps.begin(), first_steps.end()));

  // The controller and worker-2 together. The FSDP job saves into the
  // directory its uninterrupted run left checkpoints in, up to its last step:
  // it restores from its own, never from that run's newer ones.
  for (const Example& e : {kHsdp, kFsdp}) {
    const std::string dir = e.file == kFsdp.file ? absl::StrCat("straight-", ControllerKills::Stem(e))
                                                 : absl::StrCat("with-worker-", ControllerKills::Stem(e));
    const std::string id =
        t.fleet().Submit(testing::WriteJobFile(t.fleet().dir, e.file, absl::StrCat("with-worker-", ControllerKills::Stem(e)),
                                               e.steps, absl::StrCat("checkpoint { dir: \"", dir, "\" every_n_steps: ",
                                                                     kCheckpointEvery, " }")));
    ASSERT_FALSE(id.empty());
    // Past a checkpoint, and between two.
    ASSERT_TRUE(t.AwaitStep(id, kCheckpointEvery + 1));
    absl::SleepFor(t.DrawDelay());
    const ControllerKills::Resume r = t.Kill(id, 0, "worker-2");
    ASSERT_TRUE(r.ok) << "the job did not resume\n" << t.fleet().log();
    const baton::v1::CheckpointInfo& from = r.restored;
    std::printf("controller and worker-2 killed (%s, %s) at step %d: resumed at step %d %s (%lld B from peers, %lld "
                "B in place, %lld B from disk), %d steps redone; first step %.2f s after the new controller answered\n",
                ControllerKills::Stem(e).c_str(), id.c_str(), r.killed_at, from.step(),
                from.from_peers() ? "from its live workers" : absl::StrCat("from ", from.path()).c_str(),
                static_cast<long long>(from.bytes_from_peers()), static_cast<long long>(from.bytes_local()),
                static_cast<long long>(from.bytes()), from.steps_redone(), r.first_step_s);
    if (e.file == kHsdp.file) {
      // worker-2's shard lives on in its replica.
      EXPECT_TRUE(from.from_peers());
      EXPECT_EQ(from.bytes(), 0);
      EXPECT_GT(from.bytes_from_peers(), 0);
      EXPECT_GE(from.step(), r.killed_at - 1);
    } else {
      // Only its last checkpoint holds worker-2's shard: all of it from there.
      EXPECT_FALSE(from.from_peers());
      EXPECT_FALSE(from.path().empty());
      EXPECT_GT(from.bytes(), 0);
      EXPECT_EQ(from.step() % kCheckpointEvery, 0);
      EXPECT_LE(from.step(), r.killed_at + kCheckpointEvery) << "restored from the uninterrupted run's checkpoint";
      EXPECT_GE(from.steps_redone(), r.killed_at - from.step());
    }
    t.CompareToEnd(id, e, straight[e.file], absl::StrCat(ControllerKills::Stem(e), " with a worker"));
  }

  EXPECT_EQ(t.fleet().Stop(), 0);
  for (const pid_t p : t.fleet().AllPids()) EXPECT_TRUE(testing::ProcessGone(p)) << "pid " << p << " left behind";
}

// A controller that never comes back: its workers drop the mesh after
// --controller_lost_ms (its communicators and threads go) and keep the job's
// state, at the step it reached, for a controller that may still come.
TEST(ControllerKillTest, WorkersWhoseControllerStaysGoneDropTheMeshAndKeepTheJob) {
  auto cluster = testing::StartCluster(2, {}, {"--controller_lost_ms=1500"});
  ASSERT_NE(cluster, nullptr);
  const std::string addr = cluster->controller_address();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string file =
      testing::WriteJobFile(tmp != nullptr ? tmp : "/tmp", "decoder_fsdp2.textproto", "orphaned", 1000000);
  auto submitted = testing::RunCommand({testing::BatonBinary(), "submit", "--controller=" + addr, file}, absl::Seconds(60));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string id = submitted.output.substr(submitted.output.rfind("job-"));
  const std::string job_id = id.substr(0, id.find_first_of(" \n"));
  auto client = Client::Connect(addr);
  ASSERT_TRUE(client.ok());
  int step = 0;
  for (absl::Time until = absl::Now() + absl::Seconds(60); step < 5 && absl::Now() < until;) {
    auto job = (*client)->GetJob(job_id);
    step = job.ok() ? job->step() : 0;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(step, 5);
  auto status = (*client)->Status();
  ASSERT_TRUE(status.ok());
  std::vector<std::string> workers;
  for (const auto& w : status->workers()) workers.push_back(w.address());
  ASSERT_EQ(workers.size(), 2u);

  // Each worker's mesh epoch (0: none), asked directly.
  std::vector<std::unique_ptr<baton::v1::Worker::Stub>> stubs;
  for (const std::string& address : workers) {
    stubs.push_back(baton::v1::Worker::NewStub(testing::FleetChannel(*cluster, address)));
  }
  auto epoch_of = [&](size_t w) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    baton::v1::GetInfoResponse resp;
    grpc::Status s = stubs[w]->GetInfo(&ctx, baton::v1::GetInfoRequest(), &resp);
    return s.ok() ? resp.epoch() : int64_t{-1};
  };
  std::vector<int64_t> before;
  for (size_t w = 0; w < workers.size(); ++w) before.push_back(epoch_of(w));

  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(testing::PidOf(*cluster, "controller"), SIGKILL), 0);
  for (size_t w = 0; w < workers.size(); ++w) {
    int64_t epoch = epoch_of(w);
    while (epoch != 0 && absl::Now() - killed < absl::Seconds(15)) {
      absl::SleepFor(absl::Milliseconds(50));
      epoch = epoch_of(w);
    }
    const double dropped_s = absl::ToDoubleSeconds(absl::Now() - killed);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    baton::v1::GetRetainedRequest req;
    req.set_job_id(job_id);
    req.set_wait_ms(5000);
    baton::v1::GetRetainedResponse kept;
    grpc::Status s = stubs[w]->GetRetained(&ctx, req, &kept);
    std::printf("worker %s: mesh epoch %lld before the controller died, none %.2f s after (--controller_lost_ms "
                "1500); keeps %s %s at step %d (%lld B); the controller had recorded step %d\n",
                workers[w].c_str(), static_cast<long long>(before[w]), dropped_s, job_id.c_str(),
                kept.held() ? "held" : "NOT held", kept.step(), static_cast<long long>(kept.bytes()), step);
    EXPECT_GT(before[w], 0);
    EXPECT_EQ(epoch, 0);
    // Counted from its last heartbeat answered (up to one 500 ms interval
    // before the kill), checked once per interval; the second worker is
    // asked after the first was seen without a mesh.
    if (w == 0) EXPECT_GE(dropped_s, 1.0);
    EXPECT_LE(dropped_s, 4.0);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(kept.held());
    EXPECT_GE(kept.step(), step);
  }
  testing::StopAndExpectAllGone(*cluster);
}

}  // namespace
}  // namespace baton
