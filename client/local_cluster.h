// LocalCluster: a controller and N workers as child processes on loopback,
// for `baton up`, the demo and the integration tests. Ports are chosen by the
// OS and passed back through files. Children die with their parent
// (PR_SET_PDEATHSIG), and Stop() ends every one of them: SIGTERM, then SIGKILL
// after the grace period, then waitpid — no process is left behind.
//
// The controller keeps its job table in a state directory (the options', or
// one of the cluster's own, removed at Stop), so a controller that died can
// be started again on the same port (RestartController) and take its jobs
// up; the workers find it there again by themselves.
//
// Not thread-safe: one owner thread.
#ifndef BATON_CLIENT_LOCAL_CLUSTER_H_
#define BATON_CLIENT_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton {

struct LocalClusterOptions {
  int workers = 4;
  std::string controller_bin;  // empty = found next to this executable
  std::string worker_bin;
  std::string host = "127.0.0.1";
  std::vector<std::string> controller_args;  // extra flags
  std::vector<std::string> worker_args;
  absl::Duration start_timeout = absl::Seconds(60);
  // The controller's --state_dir; empty = a directory of the cluster's own.
  std::string state_dir;
};

class LocalCluster {
 public:
  struct Process {
    std::string name;  // "controller", "worker-0", ...
    pid_t pid = 0;
    bool running = true;
    int wait_status = 0;
  };

  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  const std::string& controller_address() const { return controller_address_; }
  // The fleet's client token (what `baton` and the SDK must send) and the
  // file that holds it: $BATON_TOKEN_FILE when set at Start, else a file of
  // the fleet's own.
  const std::string& client_token_file() const { return client_token_file_; }
  std::string client_token() const;
  const std::string& worker_token_file() const { return worker_token_file_; }
  std::string worker_token() const;
  const std::vector<Process>& processes() const { return processes_; }

  // Reaps children that have exited; returns a line for each newly exited.
  std::vector<std::string> Reap();
  // Whether the controller process has exited (after Reap).
  bool controller_exited() const;
  // Starts the controller again on the same address and state directory,
  // once it has exited; returns when it serves.
  absl::Status RestartController(absl::Duration timeout = absl::Seconds(30));
  // The status page's port the controller chose (its --http_port=0): a
  // restarted controller serves the page there too, so the address printed
  // stays good.
  void set_controller_http_port(int port) { controller_http_port_ = port; }
  // The workers whose process has exited (after Reap).
  std::vector<std::string> exited_workers() const;
  // Starts worker `name` again under its name (a new instance: it registers
  // once the controller has declared the old one dead); returns its pid.
  absl::StatusOr<pid_t> RestartWorker(const std::string& name);
  const std::string& state_dir() const { return state_dir_; }
  // Ends every child (SIGTERM, then SIGKILL after `grace`) and reaps it.
  // Returns how many needed SIGKILL.
  int Stop(absl::Duration grace = absl::Seconds(4));

 private:
  LocalCluster() = default;
  absl::StatusOr<pid_t> Spawn(const std::string& name, const std::string& binary,
                              const std::vector<std::string>& args);

  // A random token (hex) written to `path` (mode 0600); an existing file is
  // kept unless `replace`.
  static absl::Status WriteNewToken(const std::string& path, bool replace);

  std::string dir_;  // temporary directory for port files and tokens
  std::string state_dir_;
  bool own_state_dir_ = false;
  std::string controller_bin_;
  std::vector<std::string> controller_args_;  // as first started, --port=0 included
  std::string worker_bin_;
  std::map<std::string, std::vector<std::string>> worker_args_;  // by name
  std::string client_token_file_, worker_token_file_;
  std::string controller_address_;
  int controller_http_port_ = 0;
  std::vector<Process> processes_;
};

// Finds a sibling binary: `flag_value` if set, else next to this executable,
// else in bazel-bin's layout (../<package>/<name>).
absl::StatusOr<std::string> FindBinary(const std::string& flag_value, const std::string& package,
                                       const std::string& name);

}  // namespace baton

#endif  // BATON_CLIENT_LOCAL_CLUSTER_H_
