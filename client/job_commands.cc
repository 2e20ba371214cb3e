// `baton plan | run | submit | logs | jobs | stop`: jobs, attached (run:
// this process steps it and holds its lease) or detached (submit: the
// controller runs it; logs follows it).
#include <signal.h>

#include <algorithm>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cli.h"
#include "client/job.h"
#include "client/plan_output.h"
#include "client/step_output.h"
#include "common/job_state.h"
#include "common/json.h"
#include "common/process.h"
#include "common/text.h"
#include "strategies/dry_run.h"

namespace baton {
namespace {

// `logs --follow` across a controller restart: how long it waits for the
// controller to answer again.
constexpr absl::Duration kReconnectWait = absl::Seconds(60);

// The request of `run` and `submit`.
std::optional<baton::v1::CreateJobRequest> JobRequest(const std::string& command, const std::string& path) {
  auto job = LoadJobOrExplain(command, path);
  if (!job) return std::nullopt;
  if (!absl::GetFlag(FLAGS_resume).empty()) job->set_resume_from(absl::GetFlag(FLAGS_resume));
  baton::v1::CreateJobRequest create;
  *create.mutable_job() = *job;
  auto backend = BackendFromFlag();
  if (!backend.ok()) {
    std::fprintf(stderr, "baton %s: %s\n", command.c_str(), std::string(backend.status().message()).c_str());
    return std::nullopt;
  }
  create.set_backend(*backend);
  create.set_lease_ms(absl::GetFlag(FLAGS_lease_ms));
  return create;
}

void PrintTheory(const baton::v1::CreateJobResponse& created) {
  std::fprintf(stderr,
               "%s \"%s\": %lld parameters, %d ranks; theory per rank: comm %lld B/step, state %lld B, peak "
               "unsharded %lld B\n",
               created.job().job_id().c_str(), Printable(created.job().name()).c_str(),
               static_cast<long long>(created.parameters()), created.job().workers_needed(),
               static_cast<long long>(created.expected_comm_bytes()),
               static_cast<long long>(created.expected_state_bytes()),
               static_cast<long long>(created.expected_peak_unsharded_param_bytes()));
}

}  // namespace

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
  if (JsonOutput()) {
    std::printf("%s\n", FormatPlanJson(*job, *plan).c_str());
  } else {
    std::printf("%s", FormatPlan(*job, *plan, absl::GetFlag(FLAGS_explain)).c_str());
  }
  return 0;
}

int Run(const std::string& path) {
  // A bad job file fails here, before any worker is touched.
  auto create = JobRequest("run", path);
  if (!create) return kUsage;
  // Ctrl-C stops the job after the step in flight instead of orphaning it.
  sigset_t signals = BlockTerminationSignals();
  const bool json = JsonOutput();
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("run", client.status());
  auto created = (*client)->CreateJob(*create);
  if (!created.ok()) return Fail("run", created.status());
  const std::string job_id = created->job().job_id();
  const int steps = create->job().steps();
  std::fprintf(stderr, "%s on %s [%s]\n", job_id.c_str(), created->job().mesh_id().c_str(),
               absl::StrJoin(created->job().workers(), ", ").c_str());
  PrintTheory(*created);
  if (created->has_restored()) {
    const auto& r = created->restored();
    if (json) {
      std::printf("{\"restored\":%s}\n", ProtoToJson(r).c_str());
    } else {
      std::printf("restored %s: step %d, %lld bytes read in %.3f s\n", r.path().c_str(), r.step(),
                  static_cast<long long>(r.bytes()), r.seconds());
    }
  }
  ProgressBar progress(steps, json);
  baton::v1::StepMetrics last;
  int failed_saves = 0;
  const int per_call = std::max(0, absl::GetFlag(FLAGS_steps_per_call));  // 0: the controller's choice
  const int first_step = created->job().step() + 1;
  const absl::Time stepping = absl::Now();
  // One stream asks for every remaining step: the controller runs them back
  // to back and answers each as it settles (no round trip of ours between
  // steps); Ctrl-C is looked for between answers.
  bool interrupted = false;
  int at = first_step - 1;  // the job's step as last answered
  auto on_part = [&](const baton::v1::StepResponse& part) {
    for (const auto& m : part.metrics()) {
      progress.Finish();
      std::printf("%s\n", FormatStep(m, steps, json).c_str());
      last = m;
    }
    for (const auto& c : part.checkpoints()) std::printf("%s\n", FormatCheckpoint(c, json).c_str());
    for (const auto& e : part.checkpoint_errors()) {
      std::printf("%s\n", FormatCheckpointError(e, json).c_str());
      ++failed_saves;
    }
    std::fflush(stdout);
    progress.Update(last.step(), last);
    at = std::max(at, part.job().step());
    timespec no_wait{0, 0};
    const int sig = sigtimedwait(&signals, nullptr, &no_wait);
    interrupted = sig == SIGINT || sig == SIGTERM;
    return !interrupted;
  };
  for (int step = first_step; step <= steps;) {
    baton::v1::StepRequest req;
    req.set_job_id(job_id);
    req.set_steps(steps - step + 1);
    req.set_steps_per_call(per_call);
    req.set_timeout_ms(absl::GetFlag(FLAGS_step_timeout_ms));
    const absl::Status streamed = (*client)->StepStream(req, on_part);
    if (interrupted) {
      progress.Finish();
      auto stopped = (*client)->StopJob(job_id);
      std::fprintf(stderr, "baton run: interrupted; job %s %s\n", job_id.c_str(),
                   stopped.ok() ? "stopped" : stopped.status().ToString().c_str());
      return 1;
    }
    if (!streamed.ok()) {
      progress.Finish();
      const absl::Status why = Job::ExplainLostCall(client->get(), job_id, streamed);
      // The reason once (a job past its restarts lists every failure):
      // on stderr, with the step it failed at.
      std::fflush(stdout);
      std::fprintf(stderr, "baton run: FAILED at step %d: %s\n", std::max(step, at + 1), why.ToString().c_str());
      return 1;
    }
    step = std::max(step + 1, at + 1);
  }
  progress.Finish();
  // The stepping's wall time as this client saw it (Step calls, their
  // round trips to the workers and back), placement and loading excluded.
  const double wall_ms = absl::ToDoubleMilliseconds(absl::Now() - stepping);
  const int ran = steps - first_step + 1;
  if (json) {
    std::printf("{\"stepping\":{\"steps\":%d,\"wall_ms\":%.3f,\"steps_per_call\":%d}}\n", ran, wall_ms, per_call);
  } else {
    std::printf("stepped %d steps in %.1f ms (%.3f ms per step, %s per call)\n", ran, wall_ms, ran > 0 ? wall_ms / ran : 0.0,
                per_call > 0 ? absl::StrCat(per_call).c_str() : "the controller's choice of steps");
  }
  if (create->job().checkpoint().async()) {
    // The last async save is published before the run ends.
    auto waited = (*client)->WaitCheckpoint(job_id);
    if (!waited.ok()) {
      std::printf("%s\n", FormatCheckpointError(std::string(waited.status().message()), json).c_str());
      ++failed_saves;
    } else if (waited->checkpoint().step() > 0) {
      std::printf("%s\n", FormatCheckpoint(waited->checkpoint(), json).c_str());
    }
  }
  if (last.step() > 0) {
    std::printf("%s%s", FormatMeasuredVsPredicted(*created, last, json).c_str(), json ? "\n" : "");
  }
  // FINISHED, it holds its workers until its client lets go (it could still
  // be saved): let go now rather than when the lease lapses.
  (*client)->StopJob(job_id).IgnoreError();
  if (failed_saves > 0) {
    std::fprintf(stderr, "baton run: the job ran to its end but %d checkpoint saves failed\n", failed_saves);
    return 1;
  }
  return 0;
}

int Submit(const std::string& path) {
  auto create = JobRequest("submit", path);
  if (!create) return kUsage;
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("submit", client.status());
  auto submitted = (*client)->Submit(*create);
  if (!submitted.ok()) return Fail("submit", submitted.status());
  if (JsonOutput()) {
    std::printf("%s\n", ProtoToJson(*submitted).c_str());
  } else {
    PrintTheory(*submitted);
    std::printf("%s\n", submitted->job().job_id().c_str());
  }
  return 0;
}

int Logs(const std::string& job_id) {
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("logs", client.status());
  auto job = (*client)->GetJob(job_id);
  if (!job.ok()) return Fail("logs", job.status());
  const bool json = JsonOutput(), follow = absl::GetFlag(FLAGS_follow);
  int64_t after = 0;
  baton::v1::JobState last_state = job->state();
  // Followed across a controller that restarts: the stream is taken up
  // again after the last entry printed. The steps the job runs again from
  // its checkpoint are not printed twice: a step is printed once.
  absl::Time give_up = absl::Now() + kReconnectWait;
  bool reconnected = false;
  int printed_step = 0;
  while (true) {
    absl::Status s = (*client)->Logs(job_id, after, follow, [&](const baton::v1::JobLogEntry& e) {
      after = e.sequence();
      if (e.has_step()) {
        if (reconnected && e.step().step() <= printed_step) return true;
        printed_step = std::max(printed_step, e.step().step());
      }
      std::printf("%s\n", FormatLogEntry(e, job->steps(), json).c_str());
      std::fflush(stdout);
      if (e.has_state()) last_state = e.state().state();
      give_up = absl::Now() + kReconnectWait;
      return true;
    });
    if (s.ok() || !follow || IsEnded(last_state)) {
      if (!s.ok()) return Fail("logs", s);
      break;
    }
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() > give_up) return Fail("logs", s);
    reconnected = true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (!follow) return 0;
  auto final_status = (*client)->GetJob(job_id);
  if (final_status.ok()) last_state = final_status->state();
  return last_state == baton::v1::JOB_FINISHED ? 0 : 1;
}

int Jobs() {
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("jobs", client.status());
  auto jobs = (*client)->Jobs();
  if (!jobs.ok()) return Fail("jobs", jobs.status());
  if (JsonOutput()) {
    baton::v1::ListJobsResponse list;
    for (const auto& j : *jobs) *list.add_jobs() = j;
    std::printf("%s\n", ProtoToJson(list).c_str());
    return 0;
  }
  std::printf("%-12s %-24s %-11s %-11s %-9s %-12s %-9s %s\n", "ID", "NAME", "STATE", "STEP", "KIND", "MESH", "SPEC",
              "WORKERS");
  for (const auto& j : *jobs) {
    std::string spec;
    for (const auto& a : j.mesh()) absl::StrAppend(&spec, spec.empty() ? "" : ",", Printable(a.name(), 16), "=", a.size());
    std::printf("%-12s %-24s %-11s %-11s %-9s %-12s %-9s %s\n", j.job_id().c_str(),
                absl::StrCat("\"", Printable(j.name(), 22), "\"").c_str(),
                baton::v1::JobState_Name(j.state()).substr(4).c_str(), absl::StrCat(j.step(), "/", j.steps()).c_str(),
                j.detached() ? "detached" : "attached", j.mesh_id().empty() ? "-" : j.mesh_id().c_str(), spec.c_str(),
                j.workers().empty() ? "-" : absl::StrJoin(j.workers(), ",").c_str());
    if (!j.error().empty()) std::printf("             %s\n", Printable(j.error(), 1024).c_str());
    if (j.stragglers_size() > 0) {
      // The newest rank named slow (StragglerPolicy).
      const baton::v1::Straggler& s = j.stragglers(j.stragglers_size() - 1);
      std::printf("             slow: rank %d on %s, %.2fx its peers' compute at step %d%s (%d named)\n", s.rank(),
                  Printable(s.worker(), 128).c_str(), s.factor(), s.step(), s.evicted() ? ", moved off it" : "",
                  j.stragglers_size());
    }
  }
  return 0;
}

int StopCommand(const std::string& job_id) {
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("stop", client.status());
  auto stopped = (*client)->StopJob(job_id);
  if (!stopped.ok()) return Fail("stop", stopped.status());
  std::printf("%s %s after %d of %d steps\n", stopped->job().job_id().c_str(),
              baton::v1::JobState_Name(stopped->job().state()).c_str(), stopped->job().step(), stopped->job().steps());
  if (!stopped->job().record_error().empty()) {
    // Stopped here, but a restarted controller would not know: say so.
    std::fprintf(stderr, "baton stop: warning: %s\n", Printable(stopped->job().record_error()).c_str());
    return 1;
  }
  return 0;
}

int TraceCommand(const std::string& job_id) {
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("trace", client.status());
  const int steps = absl::GetFlag(FLAGS_steps);
  auto traced = (*client)->TraceJob(job_id, steps);
  if (!traced.ok()) return Fail("trace", traced.status());
  const std::string path = absl::GetFlag(FLAGS_o);
  if (!WriteFileAtomically(path, traced->trace_json())) {
    return Fail("trace", absl::InternalError(absl::StrCat("cannot write ", path)));
  }
  std::printf("%s: steps %d-%d on %d ranks, %lld slices, written to %s\n", job_id.c_str(), traced->first_step(),
              traced->last_step(), traced->clocks_size(), static_cast<long long>(traced->slices()), path.c_str());
  for (const baton::v1::RankClock& c : traced->clocks()) {
    std::printf("  rank %d (%s): clock offset %+.1f us, exact to within %.1f us\n", c.rank(), c.worker().c_str(),
                c.offset_us(), c.bound_us());
  }
  std::printf("clock bound: %.1f us (every rank on the controller's clock to within it)\n", traced->clock_bound_us());
  return 0;
}

int RescaleCommand(const std::string& job_id) {
  if (absl::GetFlag(FLAGS_mesh).empty()) return Fail("rescale", absl::InvalidArgumentError("--mesh is required"));
  auto client = ConnectFromFlag();
  if (!client.ok()) return Fail("rescale", client.status());
  const absl::Time asked = absl::Now();
  auto moved = (*client)->RescaleJob(job_id, absl::GetFlag(FLAGS_mesh), absl::Minutes(10));
  if (!moved.ok()) return Fail("rescale", moved.status());
  const baton::v1::CheckpointInfo& r = moved->restored();
  std::printf("%s runs on %s [%s] from step %d, %.2f s after the rescale was asked: %lld bytes from peers, "
              "%lld kept in place, %lld from disk\n",
              moved->job_id().c_str(), absl::GetFlag(FLAGS_mesh).c_str(),
              absl::StrJoin(moved->workers().begin(), moved->workers().end(), ", ").c_str(), moved->start_step(),
              absl::ToDoubleSeconds(absl::Now() - asked), static_cast<long long>(r.bytes_from_peers()),
              static_cast<long long>(r.bytes_local()), static_cast<long long>(r.bytes()));
  return 0;
}

}  // namespace baton
