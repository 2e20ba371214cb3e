// The `baton` CLI's shared pieces: its flags (defined in baton_main.cc) and
// what every command does the same way. Commands: fleet_commands.cc (up,
// status, check, watch, reference) and job_commands.cc (plan, run, submit,
// logs, jobs, stop).
#ifndef BATON_CLIENT_CLI_H_
#define BATON_CLIENT_CLI_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "proto/job.pb.h"

ABSL_DECLARE_FLAG(std::string, controller);
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(std::string, address_file);
ABSL_DECLARE_FLAG(std::string, controller_bin);
ABSL_DECLARE_FLAG(std::string, worker_bin);
ABSL_DECLARE_FLAG(std::string, reference_bin);
ABSL_DECLARE_FLAG(int64_t, heartbeat_timeout_ms);
ABSL_DECLARE_FLAG(int, http_port);
ABSL_DECLARE_FLAG(std::string, state_dir);
ABSL_DECLARE_FLAG(bool, restart_controller);
ABSL_DECLARE_FLAG(std::string, mesh);
ABSL_DECLARE_FLAG(std::string, axes);
ABSL_DECLARE_FLAG(int64_t, numel);
ABSL_DECLARE_FLAG(int, iters);
ABSL_DECLARE_FLAG(int64_t, timeout_ms);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(int64_t, step_timeout_ms);
ABSL_DECLARE_FLAG(int, steps_per_call);
ABSL_DECLARE_FLAG(bool, restart_workers);
ABSL_DECLARE_FLAG(int64_t, lease_ms);
ABSL_DECLARE_FLAG(bool, explain);
ABSL_DECLARE_FLAG(std::string, resume);
ABSL_DECLARE_FLAG(bool, optimizer);
ABSL_DECLARE_FLAG(std::string, checkpoint_root);
ABSL_DECLARE_FLAG(std::string, data_root);
ABSL_DECLARE_FLAG(int64_t, seconds);
ABSL_DECLARE_FLAG(bool, follow);
ABSL_DECLARE_FLAG(int, steps);
ABSL_DECLARE_FLAG(std::string, o);

namespace baton {

inline constexpr int kUsage = 2;

bool JsonOutput();
// The client of --controller (with the token of the environment).
absl::StatusOr<std::unique_ptr<Client>> ConnectFromFlag();
// --backend: unspecified leaves the choice to the controller.
absl::StatusOr<baton::v1::CommBackend> BackendFromFlag();
// Loads and validates a job file; prints why not and returns nullopt.
std::optional<baton::v1::JobSpec> LoadJobOrExplain(const std::string& command, const std::string& path);
// "baton COMMAND: <status>" on stderr; returns 1.
int Fail(const std::string& command, const absl::Status& s);

int Up();
int StatusCommand();
int Check();
int Watch();
int Reference(const std::string& path);
int Plan(const std::string& path);
int Run(const std::string& path);
int Submit(const std::string& path);
int Logs(const std::string& job_id);
int Jobs();
int StopCommand(const std::string& job_id);
int TraceCommand(const std::string& job_id);
// baton rescale JOB_ID --mesh dp=4
int RescaleCommand(const std::string& job_id);

}  // namespace baton

#endif  // BATON_CLIENT_CLI_H_
