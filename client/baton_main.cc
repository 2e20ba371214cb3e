// baton — the command line on top of baton::Client.
//
//   baton up --workers N [--address_file F] [--state_dir D]  local controller + N workers
//   baton status --controller ADDR [--output=json]  workers, meshes, jobs
//   baton check --controller ADDR --mesh dp=2,tp=2  check every collective (on free workers)
//   baton plan JOBFILE [--explain] [--output=json]   the dry run: schedule, bubble, per-rank figures
//   baton run --controller ADDR JOBFILE [--output=json]  an attached job: this process steps it
//   baton submit --controller ADDR JOBFILE           a detached job: the controller runs it
//   baton logs --controller ADDR JOB_ID [--follow]   a job's steps, checkpoints and states
//   baton jobs --controller ADDR [--output=json]     every job
//   baton stop --controller ADDR JOB_ID              stop a job
//   baton trace --controller ADDR JOB_ID [--steps N] [-o trace.json]  record its next steps, every rank
//   baton watch --controller ADDR [--seconds S]      stream the fleet's events
//   baton reference JOBFILE [--output=json]          the same job in one process (baton-reference)
//   baton checkpoint list|inspect DIR                checkpoints on this machine
//   baton checkpoint export DIR OUT.safetensors      one consolidated safetensors file
//   baton checkpoint export DIR OUT --format=hf      Hugging Face's Llama (model.safetensors, config.json)
//
// Exit status: 0 success, 1 failure, 2 bad usage.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/checkpoint_commands.h"
#include "client/cli.h"
#include "client/job_file.h"

ABSL_FLAG(std::string, controller, "", "Controller address HOST:PORT.");
ABSL_FLAG(std::string, output, "text", "Output format: text or json.");
// up
ABSL_FLAG(int, workers, 4, "up: number of local workers.");
ABSL_FLAG(std::string, address_file, "", "up: write the controller address here once ready.");
ABSL_FLAG(std::string, controller_bin, "", "up: path of baton-controller (default: found beside baton).");
ABSL_FLAG(std::string, worker_bin, "", "up: path of baton-worker (default: found beside baton).");
ABSL_FLAG(std::string, reference_bin, "", "reference: path of baton-reference (default: found beside baton).");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 3000, "up: controller's heartbeat timeout.");
ABSL_FLAG(int, http_port, 0,
          "up: the controller's HTTP port (status page, /api/status, /metrics); 0 lets the OS choose, -1 serves "
          "no HTTP. Workers serve /metrics on ports the OS chooses unless -1.");
// check
ABSL_FLAG(std::string, mesh, "", "check, rescale: mesh spec, e.g. dp=2,tp=2.");
ABSL_FLAG(std::string, axes, "", "check: comma-separated axes to check (default: all).");
ABSL_FLAG(int64_t, numel, 1 << 20, "check: elements per collective (P).");
ABSL_FLAG(int, iters, 3, "check: timed iterations per collective.");
ABSL_FLAG(int64_t, timeout_ms, 5000, "check: timeout of one collective.");
ABSL_FLAG(std::string, backend, "",
          "check, run, submit: gloo or nccl (default: the controller's --default_backend, gloo unless set).");
ABSL_FLAG(int64_t, step_timeout_ms, 30000, "run: timeout of one collective within a step.");
ABSL_FLAG(int, steps_per_call, 0,
          "run: K, the steps the workers run per round trip (one line per step still; periodic checkpoints still "
          "fall on their steps); 0: the controller chooses, as for a detached job (one step, then a second's worth "
          "per call at the last call's pace); 1: a round trip per step.");
ABSL_FLAG(bool, explain, false, "plan: also print every rank's Program, instruction by instruction.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the controller's client token (else $BATON_TOKEN_FILE or $BATON_TOKEN); `up` writes its "
          "fleet's token there.");
ABSL_FLAG(std::string, resume, "", "run, submit: resume from this checkpoint (or directory of step-N checkpoints).");
ABSL_FLAG(bool, optimizer, false, "checkpoint export: also export the AdamW moments.");
ABSL_FLAG(std::string, format, "baton",
          "checkpoint export: baton (Baton's names, one file) or hf (Hugging Face's Llama: a directory of "
          "model.safetensors and config.json).");
ABSL_FLAG(std::string, dtype, "f32", "checkpoint export: f32 or bf16.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "up: the daemons' checkpoint root (default: the working directory).");
ABSL_FLAG(std::string, data_root, "", "up: the workers' root for token files (default: the working directory).");
ABSL_FLAG(int64_t, seconds, 0, "watch: stop after this many seconds (0 = until interrupted).");
ABSL_FLAG(std::string, state_dir, "",
          "up: the controller's job table (default: a directory of the cluster's own, removed when it stops).");
ABSL_FLAG(bool, restart_controller, true, "up: start the controller again, on the same port, when it dies.");
ABSL_FLAG(bool, restart_workers, true,
          "up: start a worker that died again under its name (capped backoff), as a StatefulSet does.");
ABSL_FLAG(int64_t, lease_ms, 0,
          "run: stop the job when this process makes no call for this long (0: the controller's default, 10 s); "
          "up: the controller's default lease.");
ABSL_FLAG(int, steps, 10, "trace: steps to record (1 .. 100).");
ABSL_FLAG(std::string, o, "trace.json", "trace: where to write the Chrome trace (Perfetto opens it).");
ABSL_FLAG(bool, follow, false, "logs: go on printing until the job ends; exit 0 only if it FINISHED.");

namespace baton {

bool JsonOutput() { return absl::GetFlag(FLAGS_output) == "json"; }

absl::StatusOr<std::unique_ptr<Client>> ConnectFromFlag() {
  const std::string address = absl::GetFlag(FLAGS_controller);
  if (address.empty()) return absl::InvalidArgumentError("--controller HOST:PORT is required");
  return Client::Connect(address);
}

absl::StatusOr<baton::v1::CommBackend> BackendFromFlag() {
  const std::string backend = absl::AsciiStrToLower(absl::GetFlag(FLAGS_backend));
  if (backend.empty()) return baton::v1::COMM_BACKEND_UNSPECIFIED;
  if (backend == "gloo") return baton::v1::GLOO;
  if (backend == "nccl") return baton::v1::NCCL;
  return absl::InvalidArgumentError("--backend must be gloo or nccl");
}

std::optional<baton::v1::JobSpec> LoadJobOrExplain(const std::string& command, const std::string& path) {
  auto job = LoadJobSpec(path);
  if (!job.ok()) {
    std::fprintf(stderr, "baton %s: %s\n", command.c_str(), job.status().ToString().c_str());
    return std::nullopt;
  }
  return *job;
}

int Fail(const std::string& command, const absl::Status& s) {
  std::fprintf(stderr, "baton %s: %s\n", command.c_str(), s.ToString().c_str());
  return 1;
}

namespace {

std::string Usage() {
  return "usage:\n"
         "  baton up --workers N [--address_file F] [--state_dir DIR]\n"
         "  baton status --controller HOST:PORT [--output=json]\n"
         "  baton check --controller HOST:PORT --mesh dp=2,tp=2 [--numel N] [--iters K]\n"
         "  baton plan JOBFILE [--explain] [--output=json]\n"
         "  baton run --controller HOST:PORT JOBFILE [--output=json] [--resume CHECKPOINT_DIR]\n"
         "  baton submit --controller HOST:PORT JOBFILE [--output=json]\n"
         "  baton logs --controller HOST:PORT JOB_ID [--follow] [--output=json]\n"
         "  baton jobs --controller HOST:PORT [--output=json]\n"
         "  baton stop --controller HOST:PORT JOB_ID\n"
         "  baton trace --controller HOST:PORT JOB_ID [--steps N] [-o trace.json]\n"
         "  baton rescale --controller HOST:PORT JOB_ID --mesh dp=4\n"
         "  baton watch --controller HOST:PORT [--seconds S] [--output=json]\n"
         "  baton reference JOBFILE [--output=json]\n"
         "  baton checkpoint list DIR | inspect DIR | export DIR OUT.safetensors [--optimizer] [--dtype=bf16]\n"
         "  baton checkpoint export DIR OUT_DIR --format=hf [--dtype=bf16]\n";
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(Usage());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  // The token travels by file or environment, never as a flag value.
  if (!absl::GetFlag(FLAGS_token_file).empty()) setenv("BATON_TOKEN_FILE", absl::GetFlag(FLAGS_token_file).c_str(), 1);
  if (absl::GetFlag(FLAGS_output) != "text" && absl::GetFlag(FLAGS_output) != "json") {
    std::fprintf(stderr, "--output must be text or json\n");
    return kUsage;
  }
  if (positional.size() >= 2 && std::string(positional[1]) == "checkpoint") {
    return CheckpointCommand(std::vector<std::string>(positional.begin() + 2, positional.end()), JsonOutput(),
                             {absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_format), absl::GetFlag(FLAGS_dtype)});
  }
  const std::string command = positional.size() >= 2 ? positional[1] : "";
  if (positional.size() == 3) {
    const std::string arg = positional[2];
    if (command == "plan") return Plan(arg);
    if (command == "run") return Run(arg);
    if (command == "submit") return Submit(arg);
    if (command == "logs") return Logs(arg);
    if (command == "stop") return StopCommand(arg);
    if (command == "trace") return TraceCommand(arg);
    if (command == "rescale") return RescaleCommand(arg);
    if (command == "reference") return Reference(arg);
  } else if (positional.size() == 2) {
    if (command == "up") return Up();
    if (command == "status") return StatusCommand();
    if (command == "check") return Check();
    if (command == "watch") return Watch();
    if (command == "jobs") return Jobs();
  }
  std::fprintf(stderr, "%s%s", command.empty() ? "" : absl::StrCat("cannot run \"", command, "\" with ", positional.size() - 2, " arguments\n").c_str(), Usage().c_str());
  return kUsage;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
