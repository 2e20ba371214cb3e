// K steps per call compared with the whole segment in one call, finely
// interleaved within one job: creates the job of a job file (attached, as
// `baton run` does), then asks for its steps in segments of --segment
// steps, each as `baton run` asks for steps (one StepStream), rotating
// through the --ks values and K = the segment, and times each segment as
// the client sees it. A round of segments lasts a second or two, so the
// machine's drift over seconds (other tenants, clock speed) falls on every
// K alike, where whole runs a few seconds apart see it apart; and the client
// does nothing per step (`baton run` prints a line for each, and with every
// step in one call all those lines come after the last step, in its time).
//
//   k_steps --controller=ADDR --segment=25 --rounds=60 --ks=1,0
//           [--cpu_pids=PID,...] JOB_FILE
//
// Prints one JSON line:
//   {"segment": S, "rounds": R,
//    "all": {"ms": median ms per step with K = S, "cpu_ms": [...]},
//    "ks": [{"k": K, "ms": median ms per step, "ratio": median over the
//            rounds of (ms with K) / (ms with K = S), "low", "high": the
//            rounds' range, "cpu_ms": [...]}, ...]}
// where cpu_ms is, per --cpu_pids process (read from /proc: the bench runs
// on the same machine), its user + system CPU per step over that K's
// segments. The job file's own step count is ignored: the job runs one
// warm-up round (not counted) and R rounds.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/proc_stats.h"
#include "client/client.h"
#include "client/job_file.h"

ABSL_FLAG(std::string, controller, "", "the controller's address");
ABSL_FLAG(int, segment, 25, "steps per segment");
ABSL_FLAG(int, rounds, 20, "rounds counted (a segment of each K in each)");
ABSL_FLAG(std::string, ks, "1", "the steps per call compared with the whole segment (0: the controller's choice)");
ABSL_FLAG(std::string, cpu_pids, "", "processes whose CPU per step to print for each K");

namespace {

using baton::bench::CpuSecondsOf;
using baton::bench::Median;

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "k_steps: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

struct Series {
  int k = 0;
  std::vector<double> ms;      // per step, one per round
  std::vector<double> cpu_ms;  // per pid, summed over the rounds
};

std::string Json(const Series& s, int steps) {
  std::vector<std::string> cpu;
  for (double c : s.cpu_ms) cpu.push_back(absl::StrFormat("%.4f", c / steps));
  return absl::StrFormat("\"ms\":%.4f,\"cpu_ms\":[%s]", Median(s.ms), absl::StrJoin(cpu, ","));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const int segment = absl::GetFlag(FLAGS_segment);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::vector<Series> series;
  for (absl::string_view k : absl::StrSplit(absl::GetFlag(FLAGS_ks), ',', absl::SkipEmpty())) {
    Series s;
    if (!absl::SimpleAtoi(k, &s.k) || s.k < 0) return Fail("--ks", absl::InvalidArgumentError(std::string(k)));
    series.push_back(s);
  }
  std::vector<int> pids;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_cpu_pids), ',', absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(p, &pid)) return Fail("--cpu_pids", absl::InvalidArgumentError(std::string(p)));
    pids.push_back(pid);
  }
  if (args.size() != 2 || segment < 1 || rounds < 1 || series.empty()) {
    std::fprintf(stderr, "usage: k_steps --controller=ADDR [--segment=N] [--rounds=N] [--ks=K,...] "
                         "[--cpu_pids=PID,...] JOB_FILE\n");
    return 2;
  }
  series.push_back(Series{segment, {}, {}});  // K = the segment: the last
  for (Series& s : series) s.cpu_ms.assign(pids.size(), 0);
  auto spec = baton::LoadJobSpec(args[1]);
  if (!spec.ok()) return Fail("job file", spec.status());
  spec->set_steps(static_cast<int>(series.size()) * (rounds + 1) * segment);
  auto client = baton::Client::Connect(absl::GetFlag(FLAGS_controller), absl::Seconds(10));
  if (!client.ok()) return Fail("connect", client.status());
  baton::v1::CreateJobRequest create;
  *create.mutable_job() = *spec;
  auto created = (*client)->CreateJob(create);
  if (!created.ok()) return Fail("create", created.status());
  const std::string id = created->job().job_id();
  // One segment with K steps per call: its ms per step, and the CPU of
  // each pid over it.
  auto run = [&](Series& s, bool count) -> absl::Status {
    baton::v1::StepRequest req;
    req.set_job_id(id);
    req.set_steps(segment);
    req.set_steps_per_call(s.k);
    int settled = 0;
    std::vector<double> cpu_before;
    for (int pid : pids) cpu_before.push_back(CpuSecondsOf(pid));
    const absl::Time start = absl::Now();
    absl::Status streamed = (*client)->StepStream(req, [&](const baton::v1::StepResponse& part) {
      settled += part.metrics_size();
      return true;
    });
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (!streamed.ok()) return streamed;
    if (settled != segment) return absl::InternalError(absl::StrCat("a segment settled ", settled, " steps"));
    if (!count) return absl::OkStatus();
    s.ms.push_back(ms / segment);
    for (size_t i = 0; i < pids.size(); ++i) s.cpu_ms[i] += (CpuSecondsOf(pids[i]) - cpu_before[i]) * 1e3;
    return absl::OkStatus();
  };
  absl::Status failed;
  for (int round = -1; round < rounds && failed.ok(); ++round) {
    // Which K goes first rotates from round to round.
    for (size_t i = 0; i < series.size() && failed.ok(); ++i) {
      failed = run(series[(i + static_cast<size_t>(round + 1)) % series.size()], round >= 0);
    }
  }
  (*client)->StopJob(id).IgnoreError();
  if (!failed.ok()) return Fail("step", failed);
  const int counted = rounds * segment;
  const Series& whole = series.back();
  std::vector<std::string> ks;
  for (size_t i = 0; i + 1 < series.size(); ++i) {
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) ratios.push_back(series[i].ms[r] / whole.ms[r]);
    ks.push_back(absl::StrFormat("{\"k\":%d,%s,\"ratio\":%.4f,\"low\":%.4f,\"high\":%.4f}", series[i].k,
                                 Json(series[i], counted), Median(ratios),
                                 *std::min_element(ratios.begin(), ratios.end()),
                                 *std::max_element(ratios.begin(), ratios.end())));
  }
  std::printf("{\"segment\":%d,\"rounds\":%d,\"all\":{%s},\"ks\":[%s]}\n", segment, rounds, Json(whole, counted).c_str(),
              absl::StrJoin(ks, ",").c_str());
  return 0;
}
