// baton — the command line on top of baton::Client.
//
//   baton up --workers N [--address_file F]         local controller + N workers
//   baton status --controller ADDR [--output=json]  one line per worker
//   baton check --controller ADDR --mesh dp=2,tp=2  check every collective
//   baton plan JOBFILE [--explain] [--output=json]   the dry run: schedule, bubble, per-rank figures
//   baton run --controller ADDR JOBFILE [--output=json]  train through the controller
//   baton reference JOBFILE [--output=json]          the same job in one process (baton-reference)
//   baton stop --controller ADDR JOB_ID              stop a job
//   baton watch --controller ADDR [--seconds S]      stream the fleet's events
//   baton run ... --resume DIR                       resume a job from a checkpoint (resharded)
//   baton checkpoint list|inspect DIR                checkpoints on this machine
//   baton checkpoint export DIR OUT.safetensors      one consolidated safetensors file
//
// Exit status: 0 success, 1 failure, 2 bad usage.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/checkpoint_commands.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "client/plan_output.h"
#include "client/step_output.h"
#include "client/job_file.h"
#include "common/json.h"
#include "common/process.h"
#include "common/wire.h"
#include "strategies/dry_run.h"

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
ABSL_FLAG(std::string, mesh, "", "check: mesh spec, e.g. dp=2,tp=2.");
ABSL_FLAG(std::string, axes, "", "check: comma-separated axes to check (default: all).");
ABSL_FLAG(int64_t, numel, 1 << 20, "check: elements per collective (P).");
ABSL_FLAG(int, iters, 3, "check: timed iterations per collective.");
ABSL_FLAG(int64_t, timeout_ms, 5000, "check: timeout of one collective.");
ABSL_FLAG(std::string, backend, "",
          "check, run: gloo or nccl (default: the controller's --default_backend, gloo unless set).");
ABSL_FLAG(int64_t, step_timeout_ms, 30000, "run: timeout of one collective within a step.");
ABSL_FLAG(bool, explain, false, "plan: also print every rank's Program, instruction by instruction.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the controller's client token (else $BATON_TOKEN_FILE or $BATON_TOKEN); `up` writes its "
          "fleet's token there.");
ABSL_FLAG(std::string, resume, "", "run: resume from this checkpoint (or directory of step-N checkpoints).");
ABSL_FLAG(bool, optimizer, false, "checkpoint export: also export the AdamW moments.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "up: the daemons' checkpoint root (default: the working directory).");
ABSL_FLAG(std::string, data_root, "", "up: the workers' root for token files (default: the working directory).");
ABSL_FLAG(int64_t, seconds, 0, "watch: stop after this many seconds (0 = until interrupted).");

namespace baton {
namespace {

constexpr int kUsage = 2;

std::string Usage() {
  return "usage:\n"
         "  baton up --workers N [--address_file F]\n"
         "  baton status --controller HOST:PORT [--output=json]\n"
         "  baton check --controller HOST:PORT --mesh dp=2,tp=2 [--numel N] [--iters K]\n"
         "  baton plan JOBFILE [--explain] [--output=json]\n"
         "  baton run --controller HOST:PORT JOBFILE [--output=json]\n"
         "  baton reference JOBFILE [--output=json]\n"
         "  baton stop --controller HOST:PORT JOB_ID\n"
         "  baton watch --controller HOST:PORT [--seconds S]\n"
         "  baton run --controller HOST:PORT JOBFILE --resume CHECKPOINT_DIR\n"
         "  baton checkpoint list DIR | inspect DIR | export DIR OUT.safetensors [--optimizer]\n";
}

absl::StatusOr<std::unique_ptr<Client>> ConnectFromFlag() {
  const std::string address = absl::GetFlag(FLAGS_controller);
  if (address.empty()) return absl::InvalidArgumentError("--controller HOST:PORT is required");
  return Client::Connect(address);
}

// --backend: "" leaves the choice to the controller.
absl::StatusOr<baton::v1::CommBackend> BackendFromFlag() {
  const std::string backend = absl::AsciiStrToLower(absl::GetFlag(FLAGS_backend));
  if (backend.empty()) return baton::v1::COMM_BACKEND_UNSPECIFIED;
  if (backend == "gloo") return baton::v1::GLOO;
  if (backend == "nccl") return baton::v1::NCCL;
  return absl::InvalidArgumentError("--backend must be gloo or nccl");
}

int Up() {
  sigset_t signals = BlockTerminationSignals();

  LocalClusterOptions options;
  options.workers = absl::GetFlag(FLAGS_workers);
  options.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  options.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  options.controller_args.push_back(
      absl::StrCat("--heartbeat_timeout_ms=", absl::GetFlag(FLAGS_heartbeat_timeout_ms)));
  if (!absl::GetFlag(FLAGS_checkpoint_root).empty()) {
    options.controller_args.push_back(absl::StrCat("--checkpoint_root=", absl::GetFlag(FLAGS_checkpoint_root)));
    options.worker_args.push_back(absl::StrCat("--checkpoint_root=", absl::GetFlag(FLAGS_checkpoint_root)));
  }
  if (!absl::GetFlag(FLAGS_data_root).empty()) {
    options.worker_args.push_back(absl::StrCat("--data_root=", absl::GetFlag(FLAGS_data_root)));
  }
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    options.controller_args.push_back(absl::StrCat("--http_port=", absl::GetFlag(FLAGS_http_port)));
    options.worker_args.push_back("--http_port=0");
  }
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "baton up: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  std::printf("controller: %s\n", (*cluster)->controller_address().c_str());
  if (auto client = Client::Connect((*cluster)->controller_address()); client.ok()) {
    if (auto status = (*client)->Status(); status.ok() && !status->http_address().empty()) {
      std::printf("status page: http://%s/  (metrics: http://%s/metrics)\n", status->http_address().c_str(),
                  status->http_address().c_str());
    }
  }
  std::printf("client token: %s (baton commands read it from --token_file or $BATON_TOKEN_FILE)\n",
              (*cluster)->client_token_file().c_str());
  for (const auto& p : (*cluster)->processes()) std::printf("%s: pid %d\n", p.name.c_str(), p.pid);
  std::printf("ready: %d workers registered; Ctrl-C stops the cluster\n", options.workers);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_address_file).empty()) {
    WriteFileAtomically(absl::GetFlag(FLAGS_address_file), (*cluster)->controller_address());
  }
  while (true) {
    timespec poll{0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&signals, nullptr, &poll);
    for (const auto& line : (*cluster)->Reap()) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    if (sig == SIGINT || sig == SIGTERM) break;
  }
  int killed = (*cluster)->Stop(absl::Seconds(4));
  std::printf("stopped: all processes ended%s\n",
              killed ? absl::StrCat(" (", killed, " needed SIGKILL)").c_str() : "");
  return 0;
}

int StatusCommand() {
  auto client = ConnectFromFlag();
  if (!client.ok()) {
    std::fprintf(stderr, "baton status: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto status = (*client)->Status();
  if (!status.ok()) {
    std::fprintf(stderr, "baton status: %s\n", status.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::printf("%s\n", ProtoToJson(*status).c_str());
    return 0;
  }
  std::printf("%-16s %5s  %-22s %-11s %-13s %s\n", "NAME", "RANK", "ADDRESS", "STATE", "HEARTBEAT_AGE",
              "RESTARTS");
  for (const auto& w : status->workers()) {
    std::printf("%-16s %5d  %-22s %-11s %-13s %d\n", w.name().c_str(), w.rank(), w.address().c_str(),
                baton::v1::WorkerState_Name(w.state()).c_str(), absl::StrFormat("%.1fs", w.heartbeat_age_s()).c_str(),
                w.restarts());
  }
  if (status->has_mesh()) {
    std::printf("mesh: %s %s\n", status->mesh().mesh_id().c_str(),
                FormatMeshSpec(ToMeshAxes(status->mesh().axes())).c_str());
  }
  if (status->has_job()) {
    const auto& job = status->job();
    std::printf("job: %s \"%s\" %s step %d/%d%s\n", job.job_id().c_str(), job.name().c_str(),
                baton::v1::JobState_Name(job.state()).c_str(), job.step(), job.steps(),
                job.error().empty() ? "" : (" (" + job.error() + ")").c_str());
    std::printf("job totals: %lld tokens, %lld bytes sent between ranks\n",
                static_cast<long long>(job.tokens_total()), static_cast<long long>(job.comm_bytes_total()));
  }
  if (!status->http_address().empty()) std::printf("status page: http://%s/\n", status->http_address().c_str());
  return 0;
}

int Check() {
  if (absl::GetFlag(FLAGS_mesh).empty()) {
    std::fprintf(stderr, "baton check: --mesh is required, e.g. --mesh dp=2,tp=2\n");
    return kUsage;
  }
  auto spec = ParseMeshSpecProto(absl::GetFlag(FLAGS_mesh));
  if (!spec.ok()) {
    std::fprintf(stderr, "baton check: %s\n", spec.status().ToString().c_str());
    return kUsage;
  }
  baton::v1::CheckCollectivesRequest req;
  *req.mutable_spec() = *spec;
  auto backend = BackendFromFlag();
  if (!backend.ok()) {
    std::fprintf(stderr, "baton check: %s\n", std::string(backend.status().message()).c_str());
    return kUsage;
  }
  req.set_backend(*backend);
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_axes), ',', absl::SkipEmpty())) {
    req.add_axes(std::string(a));
  }
  req.set_numel(absl::GetFlag(FLAGS_numel));
  req.set_iters(absl::GetFlag(FLAGS_iters));
  req.set_timeout_ms(absl::GetFlag(FLAGS_timeout_ms));

  auto client = ConnectFromFlag();
  if (!client.ok()) {
    std::fprintf(stderr, "baton check: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto resp = (*client)->CheckCollectives(req);
  if (!resp.ok()) {
    std::printf("check FAILED: %s\n", resp.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::printf("%s\n", ProtoToJson(*resp).c_str());
    return resp->passed() ? 0 : 1;
  }
  int passed = 0;
  for (const auto& r : resp->results()) {
    const double seconds = r.seconds();
    std::string bandwidth = "-";
    if (r.bytes_per_rank() > 0 && seconds > 0) {
      bandwidth = absl::StrFormat("%.2f GB/s", r.bytes_per_rank() / seconds / 1e9);
    }
    std::printf("%-6s %-20s %-8s P=%-9lld group=%-3d bytes/rank=%-10lld time=%.3f ms  bw=%s\n",
                r.axis().c_str(), absl::AsciiStrToLower(baton::v1::CollectiveOp_Name(r.op())).c_str(),
                r.passed() ? "checked" : "FAILED", static_cast<long long>(r.numel()), r.group_size(),
                static_cast<long long>(r.bytes_per_rank()), seconds * 1e3, bandwidth.c_str());
    if (!r.passed()) std::printf("       error: %s\n", r.error().c_str());
    passed += r.passed();
  }
  const std::string mesh_spec = FormatMeshSpec(ToMeshAxes(resp->mesh().axes()));
  std::printf("check %s: %d of %d collectives checked on mesh %s (%s)\n",
              resp->passed() ? "passed" : "FAILED", passed, resp->results_size(), mesh_spec.c_str(),
              resp->mesh().mesh_id().c_str());
  return resp->passed() ? 0 : 1;
}

// Loads and validates a job file; prints why not and returns nullopt.
std::optional<baton::v1::JobSpec> LoadJobOrExplain(const std::string& command, const std::string& path) {
  auto job = LoadJobSpec(path);
  if (!job.ok()) {
    std::fprintf(stderr, "baton %s: %s\n", command.c_str(), job.status().ToString().c_str());
    return std::nullopt;
  }
  return *job;
}

// The dry run: compiles the job as the controller would and prints what it
// predicts, without starting any worker.
int Plan(const std::string& path) {
  auto job = LoadJobOrExplain("plan", path);
  if (!job) return kUsage;
  auto plan = PlanDryRun(*job);
  if (!plan.ok()) {
    std::fprintf(stderr, "baton plan: %s\n", plan.status().ToString().c_str());
    return kUsage;
  }
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::printf("%s\n", FormatPlanJson(*job, *plan).c_str());
  } else {
    std::printf("%s", FormatPlan(*job, *plan, absl::GetFlag(FLAGS_explain)).c_str());
  }
  return 0;
}

int Run(const std::string& path) {
  // A bad job file fails here, before any worker is touched.
  auto job = LoadJobOrExplain("run", path);
  if (!job) return kUsage;
  // Ctrl-C stops the job after the step in flight instead of orphaning it.
  sigset_t signals = BlockTerminationSignals();
  const bool json = absl::GetFlag(FLAGS_output) == "json";
  auto client = ConnectFromFlag();
  if (!client.ok()) {
    std::fprintf(stderr, "baton run: %s\n", client.status().ToString().c_str());
    return 1;
  }
  if (!absl::GetFlag(FLAGS_resume).empty()) job->set_resume_from(absl::GetFlag(FLAGS_resume));
  baton::v1::CreateJobRequest create;
  *create.mutable_job() = *job;
  auto backend = BackendFromFlag();
  if (!backend.ok()) {
    std::fprintf(stderr, "baton run: %s\n", std::string(backend.status().message()).c_str());
    return kUsage;
  }
  create.set_backend(*backend);
  auto created = (*client)->CreateJob(create);
  if (!created.ok()) {
    std::fprintf(stderr, "baton run: %s\n", created.status().ToString().c_str());
    return 1;
  }
  const std::string job_id = created->job().job_id();
  std::fprintf(stderr, "%s \"%s\": %lld parameters on %s (%d ranks); theory per rank: comm %lld B/step, "
               "state %lld B, peak unsharded %lld B\n",
               job_id.c_str(), job->name().c_str(), static_cast<long long>(created->parameters()),
               created->mesh().mesh_id().c_str(), created->mesh().worker_names_size(),
               static_cast<long long>(created->expected_comm_bytes()),
               static_cast<long long>(created->expected_state_bytes()),
               static_cast<long long>(created->expected_peak_unsharded_param_bytes()));
  if (created->has_restored()) {
    const auto& r = created->restored();
    if (json) {
      std::printf("{\"restored\":%s}\n", ProtoToJson(r).c_str());
    } else {
      std::printf("restored %s: step %d, %lld bytes read in %.3f s\n", r.path().c_str(), r.step(),
                  static_cast<long long>(r.bytes()), r.seconds());
    }
  }
  ProgressBar progress(job->steps(), json);
  baton::v1::StepMetrics last;
  for (int step = created->job().step() + 1; step <= job->steps(); ++step) {
    timespec no_wait{0, 0};
    if (int sig = sigtimedwait(&signals, nullptr, &no_wait); sig == SIGINT || sig == SIGTERM) {
      progress.Finish();
      auto stopped = (*client)->StopJob(job_id);
      std::fprintf(stderr, "baton run: interrupted; job %s %s\n", job_id.c_str(),
                   stopped.ok() ? "stopped" : stopped.status().ToString().c_str());
      return 1;
    }
    baton::v1::StepRequest req;
    req.set_job_id(job_id);
    req.set_steps(1);
    req.set_timeout_ms(absl::GetFlag(FLAGS_step_timeout_ms));
    auto resp = (*client)->Step(req);
    if (!resp.ok()) {
      progress.Finish();
      std::fprintf(stderr, "baton run: %s\n", resp.status().ToString().c_str());
      std::printf("run FAILED at step %d: %s\n", step, resp.status().ToString().c_str());
      return 1;
    }
    for (const auto& m : resp->metrics()) {
      progress.Finish();
      std::printf("%s\n", FormatStep(m, job->steps(), json).c_str());
      std::fflush(stdout);
      last = m;
    }
    for (const auto& c : resp->checkpoints()) {
      if (json) {
        std::printf("{\"checkpoint\":%s}\n", ProtoToJson(c).c_str());
      } else {
        std::printf("checkpoint step %d saved to %s: %lld bytes in %.3f s\n", c.step(), c.path().c_str(),
                    static_cast<long long>(c.bytes()), c.seconds());
      }
    }
    if (!resp->job().checkpoint_error().empty()) {
      std::fprintf(stderr, "baton run: %s\n", resp->job().checkpoint_error().c_str());
    }
    progress.Update(step, last);
  }
  progress.Finish();
  if (job->checkpoint().async()) {
    // The last async save is published before the run ends.
    auto waited = (*client)->WaitCheckpoint(job_id);
    if (!waited.ok()) {
      std::fprintf(stderr, "baton run: %s\n", waited.status().ToString().c_str());
    } else if (waited->checkpoint().step() > 0) {
      const auto& c = waited->checkpoint();
      if (json) {
        std::printf("{\"checkpoint\":%s}\n", ProtoToJson(c).c_str());
      } else {
        std::printf("checkpoint step %d saved to %s (async): %lld bytes in %.3f s\n", c.step(), c.path().c_str(),
                    static_cast<long long>(c.bytes()), c.seconds());
      }
    }
  }
  if (last.step() > 0) {
    std::printf("%s%s", FormatMeasuredVsPredicted(*created, last, json).c_str(), json ? "\n" : "");
  }
  return 0;
}

int StopCommand(const std::string& job_id) {
  auto client = ConnectFromFlag();
  if (!client.ok()) {
    std::fprintf(stderr, "baton stop: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto stopped = (*client)->StopJob(job_id);
  if (!stopped.ok()) {
    std::fprintf(stderr, "baton stop: %s\n", stopped.status().ToString().c_str());
    return 1;
  }
  std::printf("%s %s after %d of %d steps\n", stopped->job().job_id().c_str(),
              baton::v1::JobState_Name(stopped->job().state()).c_str(), stopped->job().step(),
              stopped->job().steps());
  return 0;
}

int Watch() {
  auto client = ConnectFromFlag();
  if (!client.ok()) {
    std::fprintf(stderr, "baton watch: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const int64_t seconds = absl::GetFlag(FLAGS_seconds);
  const bool json = absl::GetFlag(FLAGS_output) == "json";
  auto s = (*client)->Watch(
      0,
      [&](const baton::v1::Event& e) {
        if (json) {
          std::printf("%s\n", ProtoToJson(e).c_str());
        } else {
          std::printf("%s %-18s %-10s %s\n",
                      absl::FormatTime("%H:%M:%E3S", absl::FromUnixMillis(e.time_unix_ms()),
                                       absl::LocalTimeZone())
                          .c_str(),
                      e.kind().c_str(), e.worker_name().c_str(), e.message().c_str());
        }
        std::fflush(stdout);
        return true;
      },
      seconds > 0 ? absl::Seconds(seconds) : absl::InfiniteDuration());
  if (!s.ok()) {
    std::fprintf(stderr, "baton watch: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

// The reference trainer links LibTorch, which this CLI does not: hand over
// to baton-reference.
int Reference(const std::string& path) {
  auto binary = FindBinary(absl::GetFlag(FLAGS_reference_bin), "reference", "baton-reference");
  if (!binary.ok()) {
    std::fprintf(stderr, "baton reference: %s\n", binary.status().ToString().c_str());
    return 1;
  }
  std::string output = "--output=" + absl::GetFlag(FLAGS_output);
  std::vector<char*> argv = {binary->data(), const_cast<char*>(path.c_str()), output.data(), nullptr};
  execv(binary->c_str(), argv.data());
  std::fprintf(stderr, "baton reference: cannot run %s: %s\n", binary->c_str(), strerror(errno));
  return 1;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(Usage());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  // The token travels by file or environment, never as a flag value.
  if (!absl::GetFlag(FLAGS_token_file).empty()) setenv("BATON_TOKEN_FILE", absl::GetFlag(FLAGS_token_file).c_str(), 1);
  if (positional.size() >= 2 && std::string(positional[1]) == "checkpoint") {
    return CheckpointCommand(std::vector<std::string>(positional.begin() + 2, positional.end()),
                             absl::GetFlag(FLAGS_output) == "json", absl::GetFlag(FLAGS_optimizer));
  }
  if (positional.size() == 3) {
    const std::string command = positional[1];
    if (absl::GetFlag(FLAGS_output) != "text" && absl::GetFlag(FLAGS_output) != "json") {
      std::fprintf(stderr, "--output must be text or json\n");
      return kUsage;
    }
    if (command == "plan") return Plan(positional[2]);
    if (command == "run") return Run(positional[2]);
    if (command == "stop") return StopCommand(positional[2]);
    if (command == "reference") return Reference(positional[2]);
  }
  if (positional.size() != 2) {
    std::fprintf(stderr, "%s", Usage().c_str());
    return kUsage;
  }
  const std::string command = positional[1];
  if (absl::GetFlag(FLAGS_output) != "text" && absl::GetFlag(FLAGS_output) != "json") {
    std::fprintf(stderr, "--output must be text or json\n");
    return kUsage;
  }
  if (command == "up") return Up();
  if (command == "status") return StatusCommand();
  if (command == "check") return Check();
  if (command == "watch") return Watch();
  std::fprintf(stderr, "unknown command \"%s\"\n%s", command.c_str(), Usage().c_str());
  return kUsage;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
