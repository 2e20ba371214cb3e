// The control plane through real daemons: several detached jobs at once on
// disjoint sub-meshes of one fleet, each equal to its reference and
// untouched by the other's worker dying; `baton submit / logs / jobs`;
// leases, Step's deadline and checks beside a running job; checkpoint
// directories checked at submission and saves that fail at run time. Each
// case is its own test target (one process each, under the hard timeout).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <ftw.h>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/job.h"
#include "strategies/job_spec.h"
#include "tests/cluster_util.h"
#include "tests/process_util.h"
#include "tests/step_lines.h"

namespace baton {
namespace {

using testing::Field;
using testing::JsonLines;
using testing::ReadFile;
using testing::RunCommand;
using testing::Runfile;

std::string Baton() { return testing::BatonBinary(); }

// An example job file with its steps, name (and more) changed, written to
// `dir`.
std::string JobFile(const std::string& dir, const std::string& example, const std::string& name, int steps,
                    const std::vector<std::pair<std::string, std::string>>& replace = {},
                    const std::string& append = "") {
  std::string text = ReadFile(Runfile("examples/" + example));
  for (const auto& [from, to] : replace) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << example;
    if (at != std::string::npos) text.replace(at, from.size(), to);
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  std::string out;
  for (const auto& line : lines) {
    if (absl::StartsWith(line, "steps:")) {
      absl::StrAppend(&out, "steps: ", steps, "\n");
    } else if (absl::StartsWith(line, "name:")) {
      absl::StrAppend(&out, "name: \"", name, "\"\n");
    } else {
      absl::StrAppend(&out, line, "\n");
    }
  }
  absl::StrAppend(&out, append, "\n");
  const std::string path = absl::StrCat(dir, "/", name, ".textproto");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(out.c_str(), f);
  std::fclose(f);
  return path;
}

std::vector<double> Losses(const std::string& output) {
  std::vector<double> out;
  for (const auto& line : JsonLines(output)) out.push_back(Field(line, "loss"));
  return out;
}

double WorstRelative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

// `baton submit` → the job id it printed.
std::string Submit(const std::string& controller, const std::string& file) {
  auto r = RunCommand({Baton(), "submit", "--controller=" + controller, file}, absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (absl::StartsWith(*it, "job-")) return *it;
  }
  return "";
}

testing::CommandResult Follow(const std::string& controller, const std::string& job) {
  return RunCommand({Baton(), "logs", "--controller=" + controller, job, "--follow", "--output=json"},
                    absl::Seconds(200));
}

baton::v1::JobStatus JobOf(Client& client, const std::string& id) {
  auto job = client.GetJob(id);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : baton::v1::JobStatus();
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return cond();
}

const std::vector<std::pair<std::string, std::string>> kPp2 = {{"mesh { name: \"pp\" size: 4 }",
                                                                "mesh { name: \"pp\" size: 2 }"}};

TEST(ControlPlaneTest, TwoDetachedJobsAtOnceMatchTheirReferencesAndStayIsolated) {
  auto cluster = testing::StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const std::string addr = cluster->controller_address();
  const std::string dir = testing::TempDir("two_jobs");
  const std::string fsdp = JobFile(dir, "decoder_fsdp2.textproto", "fsdp", 12);
  const std::string pp = JobFile(dir, "decoder_pp4_1f1b.textproto", "pp2", 8, kPp2);
  auto fsdp_ref = RunCommand({Baton(), "reference", fsdp, "--output=json"}, absl::Seconds(120));
  auto pp_ref = RunCommand({Baton(), "reference", pp, "--output=json"}, absl::Seconds(120));
  ASSERT_EQ(fsdp_ref.exit_code, 0) << fsdp_ref.output;
  ASSERT_EQ(pp_ref.exit_code, 0) << pp_ref.output;
  // The pipeline job alone on the fleet: what it must be beside anything.
  auto alone = RunCommand({Baton(), "run", "--controller=" + addr, pp, "--output=json"}, absl::Seconds(120));
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const std::vector<double> pp_alone = Losses(alone.output);

  // Both detached at once: `submit` returns as soon as each is queued.
  const absl::Time submitted = absl::Now();
  const std::string a = Submit(addr, fsdp), b = Submit(addr, pp);
  const double submit_s = absl::ToDoubleSeconds(absl::Now() - submitted);
  ASSERT_FALSE(a.empty() || b.empty());
  auto client = Client::Connect(addr);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(WaitFor([&] { return JobOf(**client, a).step() >= 1 && JobOf(**client, b).step() >= 1; },
                      absl::Seconds(60)));
  const baton::v1::JobStatus ja = JobOf(**client, a), jb = JobOf(**client, b);
  std::printf("two submits returned in %.2f s; %s on [%s], %s on [%s] at once\n", submit_s, a.c_str(),
              absl::StrJoin(ja.workers(), ",").c_str(), b.c_str(), absl::StrJoin(jb.workers(), ",").c_str());
  for (const auto& w : ja.workers()) {
    EXPECT_EQ(std::count(jb.workers().begin(), jb.workers().end(), w), 0) << w << " in both meshes";
  }
  auto la = Follow(addr, a), lb = Follow(addr, b);
  EXPECT_EQ(la.exit_code, 0) << la.output;
  EXPECT_EQ(lb.exit_code, 0) << lb.output;
  const double worst_a = WorstRelative(Losses(la.output), Losses(fsdp_ref.output));
  const double worst_b = WorstRelative(Losses(lb.output), Losses(pp_ref.output));
  std::printf("%s FSDP dp=2: %zu steps, worst relative loss vs baton reference %.3g\n", a.c_str(),
              Losses(la.output).size(), worst_a);
  std::printf("%s 1F1B pp=2: %zu steps, worst relative loss vs baton reference %.3g; bit-identical to its run alone: "
              "%s\n",
              b.c_str(), Losses(lb.output).size(), worst_b, Losses(lb.output) == pp_alone ? "yes" : "NO");
  EXPECT_LE(worst_a, 1e-5);
  EXPECT_LE(worst_b, 1e-5);
  EXPECT_EQ(Losses(lb.output), pp_alone);
  auto jobs = RunCommand({Baton(), "jobs", "--controller=" + addr}, absl::Seconds(20));
  std::printf("baton jobs:\n%s", jobs.output.c_str());
  for (const auto& id : {a, b}) {
    bool finished = false;
    for (absl::string_view line : absl::StrSplit(jobs.output, '\n')) {
      finished = finished || (absl::StartsWith(line, id + " ") && absl::StrContains(line, "FINISHED"));
    }
    EXPECT_TRUE(finished) << id << " not FINISHED in:\n" << jobs.output;
  }

  // Again, and one worker of the FSDP job killed mid-job: the pipeline job
  // does not notice.
  const std::string long_fsdp = JobFile(dir, "decoder_fsdp2.textproto", "fsdp_long", 500);
  const std::string a2 = Submit(addr, long_fsdp), b2 = Submit(addr, pp);
  ASSERT_TRUE(WaitFor([&] { return JobOf(**client, a2).step() >= 2 && JobOf(**client, b2).step() >= 1; },
                      absl::Seconds(60)));
  const std::string victim = JobOf(**client, a2).workers(1);
  ASSERT_EQ(kill(testing::PidOf(*cluster, victim), SIGKILL), 0);
  auto lb2 = Follow(addr, b2);
  // Its job goes RECOVERING (a detached job restarts by default), waiting
  // for the dead worker's replacement, which this fleet does not start.
  ASSERT_TRUE(WaitFor([&] { return JobOf(**client, a2).state() == baton::v1::JOB_RECOVERING; }, absl::Seconds(20)));
  std::printf("%s killed: %s %s (%s); %s beside it: bit-identical to its run alone: %s\n", victim.c_str(), a2.c_str(),
              baton::v1::JobState_Name(JobOf(**client, a2).state()).c_str(),
              JobOf(**client, a2).failures_size() ? JobOf(**client, a2).failures(0).cause().c_str() : "",
              b2.c_str(), Losses(lb2.output) == pp_alone ? "yes" : "NO");
  EXPECT_EQ(lb2.exit_code, 0) << lb2.output;
  EXPECT_EQ(Losses(lb2.output), pp_alone);
  const baton::v1::JobStatus recovering = JobOf(**client, a2);
  ASSERT_GE(recovering.failures_size(), 1);
  EXPECT_TRUE(absl::StrContains(recovering.failures(0).cause(), victim)) << recovering.failures(0).cause();
  testing::StopAndExpectAllGone(*cluster);
}

TEST(ControlPlaneTest, LeasesDeadlinesAndChecksBesideJobs) {
  auto cluster = testing::StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  const std::string addr = cluster->controller_address();
  const std::string dir = testing::TempDir("leases");
  auto client = Client::Connect(addr);
  ASSERT_TRUE(client.ok());

  // A `baton run` killed mid-job: its lease lapses, the job stops, its
  // workers are free.
  const std::string file = JobFile(dir, "decoder_fsdp2.textproto", "leased", 1000);
  auto run = testing::StartBackground({Baton(), "run", "--controller=" + addr, file, "--lease_ms=2000"},
                                      dir + "/run.log");
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(ReadFile(dir + "/run.log"), "step    2/"); }, absl::Seconds(60)));
  const absl::Time killed = absl::Now();
  kill(run.pid, SIGKILL);
  testing::WaitBackground(run, absl::Seconds(10));
  std::string id;
  auto free_and_stopped = [&] {
    auto status = (*client)->Status();
    if (!status.ok() || status->jobs_size() == 0) return false;
    id = status->jobs(status->jobs_size() - 1).job_id();
    for (const auto& w : status->workers()) {
      if (!w.held_by().empty()) return false;
    }
    return status->jobs(status->jobs_size() - 1).state() == baton::v1::JOB_STOPPED;
  };
  ASSERT_TRUE(WaitFor(free_and_stopped, absl::Seconds(20)));
  const double freed_s = absl::ToDoubleSeconds(absl::Now() - killed);
  std::printf("baton run SIGKILLed: %s STOPPED (%s) and its workers free %.2f s later (lease 2.0 s; limit 7.0 s)\n",
              id.c_str(), JobOf(**client, id).error().c_str(), freed_s);
  EXPECT_LE(freed_s, 7.0);
  EXPECT_TRUE(absl::StrContains(JobOf(**client, id).error(), "lease lapsed"));

  // Step with a 1 s deadline on a job asked for more than a second of steps.
  auto spec = ParseJobSpec(ReadFile(file), false);
  ASSERT_TRUE(spec.ok());
  auto job = Job::Create(client->get(), *spec);
  ASSERT_TRUE(job.ok()) << job.status();
  baton::v1::StepRequest many;
  many.set_job_id((*job)->id());
  many.set_steps(1000);
  const absl::Time asked = absl::Now();
  auto stepped = (*client)->Step(many, absl::Seconds(1));
  const absl::Time answered = absl::Now();
  const double step_s = absl::ToDoubleSeconds(answered - asked);
  // The steps on the wire when it answered settle (a call of K steps
  // settles at once); when the last one did.
  int after = JobOf(**client, (*job)->id()).step();
  absl::Time settled = answered;
  while (absl::Now() < answered + absl::Seconds(2)) {
    absl::SleepFor(absl::Milliseconds(20));
    if (const int now = JobOf(**client, (*job)->id()).step(); now != after) {
      after = now;
      settled = absl::Now();
    }
  }
  absl::SleepFor(absl::Seconds(1));
  std::printf("Step(1000) with a 1 s deadline returned after %.2f s: %s; the steps on the wire settled %.2f s after "
              "the answer, the job then stays at step %d (%d a second later)\n",
              step_s, stepped.status().ToString().c_str(), absl::ToDoubleSeconds(settled - answered), after,
              JobOf(**client, (*job)->id()).step());
  EXPECT_LT(step_s, 2.0);
  EXPECT_EQ(stepped.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(JobOf(**client, (*job)->id()).step(), after) << "steps not started were withdrawn";

  // A check on the free workers: idle fleet against beside the job (which
  // its client steps now and then, holding its two workers).
  auto check = [&] {
    auto r = RunCommand({Baton(), "check", "--controller=" + addr, "--mesh=dp=2", "--numel=262144", "--iters=3"},
                        absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.seconds;
  };
  auto median = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  ASSERT_TRUE((*job)->Stop().ok());
  auto job2 = Job::Create(client->get(), *spec);
  ASSERT_TRUE(job2.ok()) << job2.status();
  // Checks alternate between the job idle (its client not stepping it) and
  // the job stepping, so both medians see the machine's same moments.
  std::atomic<bool> stepping{false}, done{false};
  std::thread driver([&] {
    while (!done) {
      if (stepping && !(*job2)->Step(1).ok()) break;
      absl::SleepFor(absl::Milliseconds(stepping ? 300 : 20));
    }
  });
  std::vector<double> idle_s, beside_s;
  for (int i = 0; i < 5; ++i) {
    stepping = false;
    absl::SleepFor(absl::Milliseconds(350));  // a step in flight ends
    idle_s.push_back(check());
    stepping = true;
    beside_s.push_back(check());
  }
  done = true;
  driver.join();
  const double idle = median(idle_s), beside = median(beside_s);
  std::printf("baton check --mesh dp=2: %.3f s on an idle fleet (the job paused), %.3f s beside the job stepping "
              "(medians of 5, alternating): ratio %.2f (limit 1.5)\n",
              idle, beside, beside / idle);
  EXPECT_LE(beside / idle, 1.5);
  EXPECT_EQ(JobOf(**client, (*job2)->id()).state(), baton::v1::JOB_RUNNING);
  ASSERT_TRUE((*job2)->Stop().ok());
  testing::StopAndExpectAllGone(*cluster);
}

// rm -r
void RemoveTree(const std::string& dir) {
  nftw(dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

int RegularFilesUnder(const std::string& dir) {
  static int count;
  count = 0;
  nftw(dir.c_str(), [](const char*, const struct stat* st, int type, struct FTW*) {
    if (type == FTW_F && S_ISREG(st->st_mode)) ++count;
    return 0;
  }, 16, FTW_PHYS);
  return count;
}

TEST(ControlPlaneTest, CheckpointDirectoriesAreCheckedAtSubmissionAndFailedSavesFailTheJob) {
  const std::string root = testing::TempDir("ckroot");
  auto cluster = testing::StartCluster(2, {"--checkpoint_root=" + root}, {"--checkpoint_root=" + root});
  ASSERT_NE(cluster, nullptr);
  const std::string addr = cluster->controller_address();
  const std::string dir = testing::TempDir("ckjobs");
  for (const std::string bad : {"/etc/baton-checkpoints", "../outside"}) {
    const std::string file = JobFile(dir, "decoder_fsdp2.textproto", "outside", 4, {},
                                     absl::StrCat("checkpoint { dir: \"", bad, "\" every_n_steps: 2 }"));
    auto r = RunCommand({Baton(), "run", "--controller=" + addr, file}, absl::Seconds(30));
    std::printf("checkpoint.dir %s: exit %d in %.2f s: %s", bad.c_str(), r.exit_code, r.seconds, r.output.c_str());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(absl::StrContains(r.output, bad)) << r.output;
    EXPECT_LT(r.seconds, 5.0);
  }
  auto client = Client::Connect(addr);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->Jobs()->size(), 0u) << "a refused job leaves no record";

  // A full disk: the checkpoint directory on a 1 MiB tmpfs.
  const std::string full = root + "/full";
  ASSERT_EQ(mkdir(full.c_str(), 0755), 0);
  if (mount("tmpfs", full.c_str(), "tmpfs", 0, "size=1m") != 0) {
    std::printf("SKIPPED the full-disk part: cannot mount a tmpfs here (%s; needs root)\n", strerror(errno));
  } else {
    const std::string file = JobFile(dir, "decoder_fsdp2.textproto", "full", 10, {},
                                     "checkpoint { dir: \"full\" every_n_steps: 2 max_failures: 2 }");
    auto r = RunCommand({Baton(), "run", "--controller=" + addr, file}, absl::Seconds(120));
    int failed = 0;
    for (absl::string_view line : absl::StrSplit(r.output, '\n')) failed += absl::StartsWith(line, "checkpoint FAILED");
    const int left = RegularFilesUnder(full);
    std::printf("run on a full disk: exit %d, %d \"checkpoint FAILED\" lines, %d files left on the tmpfs; last lines:\n%s",
                r.exit_code, failed, left, r.output.substr(r.output.size() > 1500 ? r.output.size() - 1500 : 0).c_str());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_GE(failed, 1);
    EXPECT_TRUE(absl::StrContains(r.output, "No space left on device")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "2 checkpoint saves failed in a row")) << r.output;
    EXPECT_EQ(left, 0) << "partial files of the failed saves stayed";
    auto status = (*client)->Status();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status->jobs(status->jobs_size() - 1).state(), baton::v1::JOB_FAILED);
    umount2(full.c_str(), MNT_DETACH);
  }
  testing::StopAndExpectAllGone(*cluster);

  // A checkpoint root that does not exist: refused, naming it.
  auto rootless = testing::StartCluster(2, {"--checkpoint_root=/nonexistent-baton-root"}, {});
  ASSERT_NE(rootless, nullptr);
  const std::string file = JobFile(dir, "decoder_fsdp2.textproto", "rootless", 4, {},
                                   "checkpoint { dir: \"ckpt\" every_n_steps: 2 }");
  auto r = RunCommand({Baton(), "submit", "--controller=" + rootless->controller_address(), file}, absl::Seconds(30));
  std::printf("root that does not exist: exit %d: %s", r.exit_code, r.output.c_str());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.output, "/nonexistent-baton-root")) << r.output;
  testing::StopAndExpectAllGone(*rootless);
  RemoveTree(root);
}

}  // namespace
}  // namespace baton
