#include "tests/process_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace baton::testing {
namespace {

std::vector<char*> Argv(std::vector<std::string>& storage) {
  std::vector<char*> argv;
  for (auto& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

// Children die with the test (even when its hard timeout kills it) and start
// with no blocked signals.
void ResetSignalsInChild() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return path;  // run by hand from the workspace root
  return absl::StrCat(srcdir, "/", workspace ? workspace : "baton", "/", path);
}

std::string TorchPython() { return Runfile("external/torch/python"); }

CommandResult RunCommand(const std::vector<std::string>& argv_in, absl::Duration timeout) {
  CommandResult result;
  std::vector<std::string> storage = argv_in;
  int pipefd[2];
  if (pipe(pipefd) != 0) return result;
  const absl::Time start = absl::Now();
  pid_t pid = fork();
  if (pid == 0) {
    ResetSignalsInChild();
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    close(pipefd[1]);
    auto argv = Argv(storage);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  const absl::Time deadline = start + timeout;
  char buf[4096];
  while (true) {
    int remaining = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd p{pipefd[0], POLLIN, 0};
    int r = poll(&p, 1, remaining);
    if (r == 0) {
      result.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

Background StartBackground(const std::vector<std::string>& argv_in, const std::string& output_path) {
  Background b;
  b.output_path = output_path;
  std::vector<std::string> storage = argv_in;
  pid_t pid = fork();
  if (pid == 0) {
    ResetSignalsInChild();
    int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    auto argv = Argv(storage);
    execv(argv[0], argv.data());
    _exit(127);
  }
  b.pid = pid;
  return b;
}

int WaitBackground(const Background& b, absl::Duration timeout, bool* timed_out) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < deadline) {
    if (waitpid(b.pid, &status, WNOHANG) == b.pid) {
      if (timed_out) *timed_out = false;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (timed_out) *timed_out = true;
  kill(b.pid, SIGKILL);
  waitpid(b.pid, &status, 0);
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string AwaitLine(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string content = ReadFile(path);
    auto nl = content.find('\n');
    if (nl != std::string::npos) return std::string(absl::StripAsciiWhitespace(content.substr(0, nl)));
    absl::SleepFor(absl::Milliseconds(20));
  }
  return "";
}

bool ProcessGone(pid_t pid) {
  // Reap it if it is our own child.
  int status;
  waitpid(pid, &status, WNOHANG);
  return kill(pid, 0) != 0 && errno == ESRCH;
}

bool AwaitGone(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!ProcessGone(pid)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(base ? base : "/tmp", "/", name, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) return "/tmp";
  return pattern;
}

void ArmHardTimeout(absl::Duration limit) {
  signal(SIGALRM, SIG_DFL);  // default action: terminate
  alarm(static_cast<unsigned>(absl::ToInt64Seconds(limit)));
}

}  // namespace baton::testing
