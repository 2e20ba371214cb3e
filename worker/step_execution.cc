#include "worker/step_execution.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/collective_ops.h"
#include "common/exceptions.h"
#include "common/file_root.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/process.h"
#include "common/text.h"
#include "program/wire.h"
#include "worker/rpc_guard.h"
#include "worker/worker_metrics.h"

namespace baton {
namespace {

constexpr int64_t kMaxTimeoutMs = kMaxCheckTimeoutMs;

}  // namespace

grpc::Status StepExecution::LoadProgram(const baton::v1::LoadProgramRequest& req,
                                        baton::v1::LoadProgramResponse* resp) {
  return Guarded("LoadProgram", [&]() -> grpc::Status {
    auto state = host_->MeshOfEpoch(req.epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    const baton::v1::Program& program = req.program();
    // A job's token file is opened only under the data root.
    std::optional<baton::v1::Program> confined_copy;
    const baton::v1::Program* confined = &program;
    if (program.data().has_token_file()) {
      auto path = ResolveUnderRoot(options_.data_root, program.data().token_file().path());
      if (!path.ok()) {
        return ToGrpcStatus(absl::Status(path.status().code(), absl::StrCat("token file: ", path.status().message())));
      }
      confined_copy = program;
      confined_copy->mutable_data()->mutable_token_file()->set_path(*path);
      confined = &*confined_copy;
    }
    if (program.rank() != (*state)->rank) {
      return Invalid(absl::StrCat("program is for rank ", program.rank(), " but this worker is rank ", (*state)->rank));
    }
    // One job at a time: the previous one's memory goes back before the new
    // one's is allocated, and the new one's growth is measured from here.
    absl::MutexLock lock(&(*state)->run_mu);
    (*state)->executor.reset();
    (*state)->job_id.clear();
    (*state)->failed_step = 0;
    malloc_trim(0);
    ResetPeakMemory();
    const ProcessMemory memory = ReadProcessMemory();
    (*state)->memory_baseline = memory.resident - memory.shared;
    auto executor = Executor::Create(*confined, (*state)->comms, at::Device(options_.device));
    if (!executor.ok()) return ToGrpcStatus(executor.status());
    (*executor)->set_testing_slow_compute(options_.testing_slow_compute);
    resp->set_state_bytes((*executor)->state_bytes());
    (*state)->job_id = program.job_id();
    (*state)->executor = std::move(*executor);
    (*state)->recent.clear();
    return grpc::Status::OK;
  });
}

std::pair<absl::Status, int64_t> StepExecution::RunSteps(MeshState& mesh, const std::function<bool()>& cancelled,
                                                         const baton::v1::RunStepRequest& req,
                                                         baton::v1::RunStepResponse* resp) {
  const int steps = std::max(1, req.steps());
  for (int i = 0; i < steps; ++i) {
    const int64_t step = req.step() + i;
    if (i > 0 && cancelled()) {
      return {absl::CancelledError(absl::StrCat("cancelled after ", i, " of ", steps, " steps")), step};
    }
    StepDetail detail;
    // A traced step's spans travel with the answer (a failed step's not).
    baton::v1::StepTrace trace;
    auto metrics = mesh.executor->RunStep(step, Milliseconds(req.timeout_ms()), &detail, req.trace() ? &trace : nullptr);
    if (!metrics.ok()) return {metrics.status(), step};
    // The collectives' shared-memory segments grow only while a job
    // starts (to its largest operation) and are shared with the peers:
    // counted apart from the growth the plan predicts.
    const ProcessMemory memory = ReadProcessMemory();
    metrics->set_memory_growth_bytes(std::max<int64_t>(0, memory.peak - memory.shared - mesh.memory_baseline));
    metrics->set_shared_memory_bytes(memory.shared);
    // The figures by collective and by instruction are this worker's own
    // (its metrics, worker/step_detail.h): counted here as each step ends,
    // they never travel.
    if (options_.metrics != nullptr) options_.metrics->ObserveStep(req.job_id(), *metrics, detail);
    mesh.recent.push_back(*metrics);
    if (mesh.recent.size() > RetainedStates::kRecentSteps) mesh.recent.pop_front();
    *resp->add_metrics() = std::move(*metrics);
    if (req.trace()) *resp->add_traces() = std::move(trace);
  }
  return {absl::OkStatus(), 0};
}

grpc::Status StepExecution::ValidateStepRequest(const baton::v1::RunStepRequest& req) {
  if (req.timeout_ms() < 1 || req.timeout_ms() > kMaxTimeoutMs) {
    return Invalid(absl::StrCat("timeout_ms ", req.timeout_ms(), " outside [1, ", kMaxTimeoutMs, "]"));
  }
  if (req.steps() < 0 || req.steps() > kMaxStepsPerRunStep) {
    return Invalid(absl::StrCat("steps ", req.steps(), " outside [0, ", kMaxStepsPerRunStep, "]"));
  }
  return grpc::Status::OK;
}

grpc::Status StepExecution::StepOnThread(MeshState& mesh, const baton::v1::RunStepRequest& req,
                                         const std::function<bool()>& cancelled, baton::v1::RunStepResponse* resp) {
  absl::Status failed;
  int64_t failed_step = 0;
  {
    absl::MutexLock lock(&mesh.run_mu);
    if (grpc::Status missing = RequireJob(mesh, req.job_id(), host_->name()); !missing.ok()) return missing;
    if (mesh.failed_step != 0) {
      return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("step ", mesh.failed_step, " of job ", mesh.job_id,
                                                                  " failed on this rank before step ", req.step()));
    }
    if (const int64_t at = mesh.executor->step(); req.step() != at + 1) {
      // A call out of turn (a stale or a foreign one) is refused; the job
      // goes on.
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", mesh.job_id, " is at step ", at, " on this rank: step ", req.step(),
                                       " is not its next"));
    }
    std::tie(failed, failed_step) = RunSteps(mesh, cancelled, req, resp);
    if (!failed.ok()) mesh.failed_step = failed_step;
  }
  resp->set_rank(mesh.rank);
  if (!failed.ok()) {
    Logf("worker %s: job %s step %lld failed: %s", host_->name().c_str(), req.job_id().c_str(),
         static_cast<long long>(failed_step), failed.ToString().c_str());
    if (options_.metrics != nullptr) options_.metrics->ObserveFailedStep(req.job_id());
    // The steps before the failed one did complete here: their metrics
    // travel in the error's details (a RunStepResponse).
    resp->set_failed_step(failed_step);
    const grpc::Status status = ToGrpcStatus(failed);
    return grpc::Status(status.error_code(), status.error_message(), resp->SerializeAsString());
  }
  return grpc::Status::OK;
}

grpc::Status StepExecution::RunStep(const grpc::ServerContext& ctx, const baton::v1::RunStepRequest& req,
                                    baton::v1::RunStepResponse* resp) {
  return Guarded("RunStep", [&]() -> grpc::Status {
    if (grpc::Status invalid = ValidateStepRequest(req); !invalid.ok()) return invalid;
    auto state = host_->MeshOfEpoch(req.epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    std::shared_ptr<MeshState> mesh = std::move(*state);
    {
      absl::MutexLock lock(&mesh->run_mu);
      if (grpc::Status turn = AwaitTurn(*mesh, ctx, req.step()); !turn.ok()) return turn;
    }
    // On the mesh's own thread: one thread computes every step of a job,
    // one step per call or many, over gRPC or the step channel
    // (worker/step_thread.h). The turn is checked again there.
    grpc::Status status;
    mesh->steps.Run([&] {
      status = StepOnThread(
          *mesh, req, [&ctx] { return ctx.IsCancelled(); }, resp);
    });
    // A failed step can leave transfers running under its aborted waits;
    // if the mesh was dropped meanwhile, this is its last reference, and
    // tearing it down waits for them: not before the answer goes out.
    if (resp->failed_step() != 0) MeshHost::DropInBackground(std::move(mesh));
    return status;
  });
}

void StepExecution::AnswerChannelStep(MeshState& mesh, const baton::v1::RunStepRequest& req,
                                      const std::function<bool()>& hung_up, baton::v1::StepChannelReply* reply) {
  const absl::Time arrived = absl::Now();
  const grpc::Status status = Guarded("RunStep", [&]() -> grpc::Status {
    if (grpc::Status invalid = ValidateStepRequest(req); !invalid.ok()) return invalid;
    if (req.epoch() != mesh.mesh.epoch()) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("the step channel of mesh epoch ", mesh.mesh.epoch(), " got a call for epoch ", req.epoch()));
    }
    return StepOnThread(mesh, req, hung_up, reply->mutable_response());
  });
  reply->set_code(static_cast<int>(status.error_code()));
  reply->set_message(status.error_message());
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveStepChannelCall(status.error_code(), absl::ToDoubleSeconds(absl::Now() - arrived));
  }
}

grpc::Status StepExecution::AwaitTurn(MeshState& mesh, const grpc::ServerContext& ctx, int64_t step) {
  // The controller puts a call on the wire while the one before it runs:
  // it waits here for that one to end (or fail, or its mesh to go).
  auto ready = [&mesh, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu) {
    return mesh.executor == nullptr || mesh.failed_step != 0 || mesh.executor->step() + 1 >= step;
  };
  const absl::Time give_up = absl::Now() + kMaxTurnWait;
  while (!mesh.run_mu.AwaitWithTimeout(absl::Condition(&ready), kTurnPoll)) {
    if (ctx.IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting for its turn");
    if (absl::Now() >= give_up) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("step ", step, " waited ", absl::FormatDuration(kMaxTurnWait), " for step ",
                                       step - 1, " to end; the job is at step ", mesh.executor->step()));
    }
  }
  return grpc::Status::OK;
}

grpc::Status RequireJob(const MeshState& mesh, const std::string& job_id, const std::string& worker) {
  if (mesh.executor == nullptr || mesh.job_id != job_id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("job ", Printable(job_id, kShownIdBytes), " is not loaded on worker ", worker));
  }
  return grpc::Status::OK;
}

}  // namespace baton
