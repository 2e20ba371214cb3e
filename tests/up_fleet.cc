#include "tests/up_fleet.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/cluster_util.h"
#include "tests/step_lines.h"

namespace baton::testing {
namespace {

// The pid a line of `baton up`'s log gives for `name`: "NAME: pid N" at the
// start, "NAME restarted (pid N)" / "controller restarted on ... (pid N)".
pid_t PidOfLine(absl::string_view line, const std::string& name) {
  int pid = 0;
  if (absl::StartsWith(line, name + ": pid ") && absl::SimpleAtoi(line.substr(name.size() + 6), &pid)) return pid;
  if (absl::StartsWith(line, name + " restarted ")) {
    const size_t open = line.rfind("(pid ");
    if (open != absl::string_view::npos && absl::SimpleAtoi(line.substr(open + 5, line.size() - open - 6), &pid)) {
      return pid;
    }
  }
  return 0;
}

}  // namespace

std::string UpFleet::log() const { return ReadFile(dir + "/up.log"); }

CommandResult UpFleet::Cli(std::vector<std::string> args, absl::Duration timeout) const {
  args.insert(args.begin(), BatonBinary());
  args.push_back("--controller=" + addr);
  return RunCommand(args, timeout);
}

std::string UpFleet::Submit(const std::string& job_file) const {
  const CommandResult r = Cli({"submit", job_file});
  std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  return r.exit_code == 0 && !lines.empty() ? lines.back() : std::string();
}

pid_t UpFleet::CurrentPid(const std::string& name) const {
  pid_t pid = 0;
  for (absl::string_view line : absl::StrSplit(log(), '\n')) {
    if (const pid_t p = PidOfLine(line, name); p > 0) pid = p;
  }
  return pid;
}

std::vector<pid_t> UpFleet::AllPids() const {
  std::vector<pid_t> pids;
  for (absl::string_view line : absl::StrSplit(log(), '\n')) {
    const size_t end = line.find_first_of(": ");
    if (end == absl::string_view::npos) continue;
    const std::string name(line.substr(0, end));
    if (name != "controller" && !absl::StartsWith(name, "worker-")) continue;
    if (const pid_t p = PidOfLine(line, name); p > 0) pids.push_back(p);
  }
  return pids;
}

int UpFleet::Stop() {
  if (up.pid <= 0) return 0;
  kill(up.pid, SIGTERM);
  const int code = WaitBackground(up, absl::Seconds(30));
  up.pid = 0;
  return code;
}

Background UpFleet::StartWorker(const std::string& name) const {
  std::string token;
  for (absl::string_view line : absl::StrSplit(log(), '\n')) {
    if (absl::StartsWith(line, "worker token: ")) {
      token = std::string(line.substr(14, line.find(' ', 14) - 14));
    }
  }
  return StartBackground({Runfile("worker/baton-worker"), "--controller=" + addr, "--name=" + name,
                          "--host=127.0.0.1", "--port=0", "--worker_token_file=" + token,
                          "--checkpoint_root=" + dir + "/root"},
                         dir + "/" + name + "-by-hand.log");
}

UpFleet StartUpFleet(const std::string& name, int workers, const std::vector<std::string>& extra) {
  UpFleet f;
  f.dir = TempDir(name);
  const std::string root = f.dir + "/root";
  if (system(absl::StrCat("mkdir -p ", root).c_str()) != 0) return f;
  setenv("BATON_TOKEN_FILE", (f.dir + "/client.token").c_str(), 1);
  std::vector<std::string> args = {BatonBinary(), "up", absl::StrCat("--workers=", workers),
                                   "--address_file=" + f.dir + "/addr", "--checkpoint_root=" + root, "--http_port=-1",
                                   "--controller_bin=" + Runfile("controller/baton-controller"),
                                   "--worker_bin=" + Runfile("worker/baton-worker")};
  args.insert(args.end(), extra.begin(), extra.end());
  f.up = StartBackground(args, f.dir + "/up.log");
  f.addr = AwaitLine(f.dir + "/addr", absl::Seconds(60));
  return f;
}

std::string WriteJobFile(const std::string& dir, const std::string& example, const std::string& name, int steps,
                         const std::string& extra) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(ReadFile(Runfile("examples/" + example)), '\n')) {
    if (absl::StartsWith(line, "name:") || absl::StartsWith(line, "steps:")) continue;
    lines.emplace_back(line);
  }
  const std::string text =
      absl::StrCat("name: \"", name, "\"\n", absl::StrJoin(lines, "\n"), "\nsteps: ", steps, "\n", extra, "\n");
  const std::string path = absl::StrCat(dir, "/", name, ".textproto");
  FILE* f = std::fopen(path.c_str(), "w");
  if (f != nullptr) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  return path;
}

CommandResult UpFleet::Follow(const std::string& job, absl::Duration timeout) const {
  return Cli({"logs", job, "--follow", "--output=json"}, timeout);
}

uint64_t TestSeed() {
  const char* seed = std::getenv("BATON_TEST_SEED");
  return seed != nullptr ? std::strtoull(seed, nullptr, 10) : absl::ToUnixNanos(absl::Now());
}

std::map<int, double> StepLosses(const std::string& output) {
  std::map<int, double> out;
  for (const auto& line : JsonLines(output)) out[static_cast<int>(Field(line, "step"))] = Field(line, "loss");
  return out;
}

}  // namespace baton::testing
