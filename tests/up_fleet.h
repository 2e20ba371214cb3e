// A fleet started the way a user starts one - `baton up` as a child process,
// with its log - for the tests of what `baton up` itself does (restarting a
// dead controller or worker): the address, a CLI against it, the current pid
// of each process it started, and job files derived from the examples.
#ifndef BATON_TESTS_UP_FLEET_H_
#define BATON_TESTS_UP_FLEET_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace baton::testing {

struct UpFleet {
  std::string dir;   // the test's directory: up.log, addr, root/ (the checkpoint root)
  std::string addr;  // the controller, once it serves ("" if it never did)
  Background up;

  std::string log() const;
  // `baton ARGS --controller=ADDR`.
  CommandResult Cli(std::vector<std::string> args, absl::Duration timeout = absl::Seconds(60)) const;
  // `baton submit FILE`: the job id (its last line).
  std::string Submit(const std::string& job_file) const;
  // `baton logs JOB --follow --output=json`: until the job ended.
  CommandResult Follow(const std::string& job, absl::Duration timeout = absl::Seconds(240)) const;
  // The current pid of "controller" or "worker-N": its first, or the one
  // `baton up` restarted last; 0 when unknown.
  pid_t CurrentPid(const std::string& name) const;
  // Every pid `baton up` started (restarts included).
  std::vector<pid_t> AllPids() const;
  // SIGTERM to `baton up`; its exit status (-1 past 30 s).
  int Stop();
  // Starts worker `name` by hand (as a person would, beside `baton up`), its
  // output in dir/NAME-by-hand.log.
  Background StartWorker(const std::string& name) const;
};

// `baton up --workers=N` (and `extra` flags) from the runfiles in a fresh
// directory named `name`, its client token there ($BATON_TOKEN_FILE),
// checkpoints under dir/root.
UpFleet StartUpFleet(const std::string& name, int workers, const std::vector<std::string>& extra = {});

// examples/`example` renamed `name` with `steps` steps, `extra` appended;
// written into `dir`, returning its path.
std::string WriteJobFile(const std::string& dir, const std::string& example, const std::string& name, int steps,
                         const std::string& extra = "");

// $BATON_TEST_SEED, else the time: what a test draws its faults from (printed).
uint64_t TestSeed();

// step -> loss of the step lines of `output` (a step seen twice keeps its last).
std::map<int, double> StepLosses(const std::string& output);

}  // namespace baton::testing

#endif  // BATON_TESTS_UP_FLEET_H_
