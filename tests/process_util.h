// Helpers for tests that start the real binaries: locating them in Bazel's
// runfiles, running a command with a hard timeout while capturing its output,
// and checking that a process is gone.
#ifndef BATON_TESTS_PROCESS_UTIL_H_
#define BATON_TESTS_PROCESS_UTIL_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace baton::testing {

// Path of a workspace-relative file in the test's runfiles.
std::string Runfile(const std::string& path);

// The interpreter of Baton's Python environment (torch 2.11, transformers:
// third_party/python/env.sh), from the runfiles of a test that has
// //third_party:python in its data.
std::string TorchPython();

struct CommandResult {
  int exit_code = -1;  // -1 when killed for running past the timeout
  bool timed_out = false;
  std::string output;  // stdout and stderr interleaved
  double seconds = 0;
};

// Runs argv[0] with the rest as arguments; kills it (SIGKILL) at `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout);

// A child started in the background with its output going to a file.
struct Background {
  pid_t pid = 0;
  std::string output_path;
};
Background StartBackground(const std::vector<std::string>& argv, const std::string& output_path);
// Waits for a background child; -1 if it had not exited by `timeout` (it is
// then killed).
int WaitBackground(const Background& b, absl::Duration timeout, bool* timed_out = nullptr);

std::string ReadFile(const std::string& path);
// Waits until `path` holds a line; returns it ("" on timeout).
std::string AwaitLine(const std::string& path, absl::Duration timeout);

// True once `pid` no longer exists (reaped, not a zombie).
bool ProcessGone(pid_t pid);
// Waits up to `timeout` for ProcessGone(pid).
bool AwaitGone(pid_t pid, absl::Duration timeout);

// A fresh directory under TEST_TMPDIR.
std::string TempDir(const std::string& name);

// Kills this test process (and, through PR_SET_PDEATHSIG, every cluster it
// started) if it runs longer than `limit`: nothing may hang a test run.
void ArmHardTimeout(absl::Duration limit);

}  // namespace baton::testing

#endif  // BATON_TESTS_PROCESS_UTIL_H_
