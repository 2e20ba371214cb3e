#include "program/wire.h"
#include "controller/controller_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/text.h"
#include "controller/fleet_checks.h"
#include "controller/log_stream.h"

namespace baton {
namespace {

constexpr int64_t kDefaultStepTimeoutMs = 30000;
constexpr int64_t kMaxStepTimeoutMs = 600000;
constexpr int kMaxStepsAsked = 1000000;
constexpr int64_t kDefaultWaitMs = 600000;
constexpr size_t kMaxRequestIdBytes = 128;
// A Step answers this long before its deadline, so the answer arrives in
// time; a call without a deadline waits at most kMaxStepWait.
constexpr absl::Duration kReplyMargin = absl::Milliseconds(100);
constexpr absl::Duration kMaxStepWait = absl::Hours(24);

// The call's deadline, less the time the answer needs.
absl::Time AnswerBy(const grpc::ServerContext* ctx, absl::Duration cap) {
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  return std::min(absl::Now() + cap, deadline - kReplyMargin);
}

void FillCreated(const Job& job, baton::v1::CreateJobResponse* resp) {
  const std::shared_ptr<const JobPlan> plan = job.plan();
  const PlanTheory& theory = plan->theory;
  *resp->mutable_job() = job.status();
  resp->set_parameters(theory.parameters);
  resp->set_expected_comm_bytes(theory.comm_bytes);
  resp->set_expected_memory_bytes(theory.memory_bytes);
  resp->set_expected_state_bytes(theory.state_bytes);
  resp->set_expected_peak_unsharded_param_bytes(theory.peak_unsharded_param_bytes);
  resp->set_expected_peak_live_microbatches(theory.peak_live_microbatches);
  resp->set_expected_peak_live_activation_bytes(theory.peak_live_activation_bytes);
  resp->set_expected_idle_fraction(plan->max_idle_fraction);
  if (!resp->job().restored().path().empty()) *resp->mutable_restored() = resp->job().restored();
}

}  // namespace

ControllerService::ControllerService(WorkerRegistry* registry, MeshManager* meshes, JobManager* jobs,
                                     EventLog* events, Authenticator auth)
    : registry_(registry), meshes_(meshes), jobs_(jobs), events_(events), auth_(std::move(auth)) {}

void ControllerService::set_http_address(const std::string& address) {
  absl::MutexLock lock(&mu_);
  http_address_ = address;
}

absl::StatusOr<std::shared_ptr<Job>> ControllerService::FindJob(const std::string& id) const {
  if (auto s = CheckJobId(id); !s.ok()) return s;
  auto job = jobs_->Find(id);
  if (!job.ok()) return absl::NotFoundError(absl::StrCat("unknown job \"", id, "\""));
  return job;
}

grpc::Status ControllerService::Status(grpc::ServerContext* ctx, const baton::v1::StatusRequest* req,
                                       baton::v1::StatusResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  *resp = Snapshot(req->with_history());
  return grpc::Status::OK;
}

baton::v1::StatusResponse ControllerService::Snapshot(bool with_history) const {
  baton::v1::StatusResponse resp;
  for (auto& w : meshes_->Workers()) *resp.add_workers() = std::move(w);
  for (auto& m : meshes_->Meshes()) *resp.add_meshes() = std::move(m);
  resp.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(registry_->heartbeat_timeout()));
  const std::vector<std::shared_ptr<Job>> jobs = jobs_->Jobs();
  for (const auto& job : jobs) *resp.add_jobs() = job->status();
  resp.set_newest_trace_job(newest_trace_.job_id());
  if (with_history) {
    for (size_t i = jobs.size() > kHistoryJobs ? jobs.size() - kHistoryJobs : 0; i < jobs.size(); ++i) {
      baton::v1::JobHistory* history = resp.add_histories();
      history->set_job_id(jobs[i]->id());
      // Steps are most of a log: its newest twice the steps shown are enough
      // to read (by count: sequence numbers jump after a controller restart).
      std::vector<baton::v1::StepMetrics> steps;
      for (const auto& e : jobs[i]->log().After(0, absl::ZeroDuration(), 2 * kHistorySteps)) {
        if (e.has_step()) steps.push_back(e.step());
      }
      for (size_t s = steps.size() > kHistorySteps ? steps.size() - kHistorySteps : 0; s < steps.size(); ++s) {
        *history->add_steps() = steps[s];
      }
    }
    for (auto& e : events_->After(0, absl::ZeroDuration(), kPageEvents)) *resp.add_events() = std::move(e);
  }
  absl::MutexLock lock(&mu_);
  resp.set_http_address(http_address_);
  return resp;
}

grpc::Status ControllerService::CreateMesh(grpc::ServerContext* ctx, const baton::v1::CreateMeshRequest* req,
                                           baton::v1::CreateMeshResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto mesh = FormIdleMesh(*meshes_, req->spec(), req->backend(), absl::StrCat("mesh-request-", ++checks_));
  if (!mesh.ok()) return ToGrpcStatus(mesh.status());
  *resp->mutable_mesh() = *mesh;
  return grpc::Status::OK;
}

grpc::Status ControllerService::CheckCollectives(grpc::ServerContext* ctx,
                                                 const baton::v1::CheckCollectivesRequest* req,
                                                 baton::v1::CheckCollectivesResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto checked = RunFleetCheck(*meshes_, *events_, *req, absl::StrCat("check-", ++checks_));
  if (!checked.ok()) return ToGrpcStatus(checked.status());
  *resp = std::move(*checked);
  return grpc::Status::OK;
}

grpc::Status ControllerService::EnterStream() {
  if (streams_.fetch_add(1) >= kMaxStreams) {
    streams_.fetch_sub(1);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(kMaxStreams, " Watch and JobLogs streams are open (the limit); close one first"));
  }
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<baton::v1::Event>* ControllerService::Watch(grpc::CallbackServerContext* ctx,
                                                                     const baton::v1::WatchRequest* req) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return RefusedStream<baton::v1::Event>(denied);
  if (grpc::Status full = EnterStream(); !full.ok()) return RefusedStream<baton::v1::Event>(full);
  return new LogStream<baton::v1::Event>(events_, nullptr, std::max<int64_t>(0, req->after_sequence()), kStreamHistory,
                                         /*follow=*/true, &streams_);
}

grpc::ServerWriteReactor<baton::v1::JobLogEntry>* ControllerService::JobLogs(grpc::CallbackServerContext* ctx,
                                                                             const baton::v1::JobLogsRequest* req) {
  using Entry = baton::v1::JobLogEntry;
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return RefusedStream<Entry>(denied);
  auto job = FindJob(req->job_id());
  if (!job.ok()) return RefusedStream<Entry>(ToGrpcStatus(job.status()));
  if (grpc::Status full = EnterStream(); !full.ok()) return RefusedStream<Entry>(full);
  Job* j = job->get();
  return new LogStream<Entry>(&j->log(), *job, std::max<int64_t>(0, req->after_sequence()), Job::kLogCapacity,
                              req->follow(), &streams_);
}

grpc::Status ControllerService::CreateJob(grpc::ServerContext* ctx, const baton::v1::CreateJobRequest* req,
                                          baton::v1::CreateJobResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto job = jobs_->Create(*req, AnswerBy(ctx, kMaxStepWait));
  if (!job.ok()) return ToGrpcStatus(job.status());
  FillCreated(**job, resp);
  return grpc::Status::OK;
}

grpc::Status ControllerService::SubmitJob(grpc::ServerContext* ctx, const baton::v1::CreateJobRequest* req,
                                          baton::v1::CreateJobResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto job = jobs_->Submit(*req);
  if (!job.ok()) return ToGrpcStatus(job.status());
  FillCreated(**job, resp);
  return grpc::Status::OK;
}

namespace {

// A Step request's figures with their defaults, or INVALID_ARGUMENT.
struct StepArgs {
  int steps = 1;
  int per_call = 0;  // the controller chooses
  int64_t timeout_ms = kDefaultStepTimeoutMs;
};

absl::StatusOr<StepArgs> ParseStep(const baton::v1::StepRequest& req) {
  if (auto s = CheckJobId(req.job_id()); !s.ok()) return s;
  StepArgs a;
  if (req.timeout_ms() != 0) a.timeout_ms = req.timeout_ms();
  if (a.timeout_ms < 1 || a.timeout_ms > kMaxStepTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", a.timeout_ms, " outside [1, ", kMaxStepTimeoutMs, "]"));
  }
  if (req.steps() != 0) a.steps = req.steps();
  if (a.steps < 0 || a.steps > kMaxStepsAsked) {
    return absl::InvalidArgumentError(absl::StrCat("steps must be in [1, ", kMaxStepsAsked, "]"));
  }
  a.per_call = req.steps_per_call();
  if (a.per_call < 0 || a.per_call > kMaxStepsPerRunStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps_per_call must be in [1, ", kMaxStepsPerRunStep, "], or 0 for the controller's choice"));
  }
  return a;
}

void FillStep(JobManager::StepOutcome&& outcome, baton::v1::StepResponse* resp) {
  for (auto& m : outcome.metrics) *resp->add_metrics() = std::move(m);
  for (auto& c : outcome.checkpoints) *resp->add_checkpoints() = std::move(c);
  for (auto& e : outcome.checkpoint_errors) resp->add_checkpoint_errors(std::move(e));
  *resp->mutable_job() = std::move(outcome.status);
}

grpc::Status StepStatus(const std::string& job_id, const absl::Status& s) {
  return ToGrpcStatus(s.code() == absl::StatusCode::kNotFound
                          ? absl::NotFoundError(absl::StrCat("unknown job \"", job_id, "\""))
                          : s);
}

}  // namespace

grpc::Status ControllerService::Step(grpc::ServerContext* ctx, const baton::v1::StepRequest* req,
                                     baton::v1::StepResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto args = ParseStep(*req);
  if (!args.ok()) return ToGrpcStatus(args.status());
  auto outcome = jobs_->Step(req->job_id(), args->steps, args->per_call, args->timeout_ms,
                             AnswerBy(ctx, kMaxStepWait), [ctx] { return ctx->IsCancelled(); });
  if (!outcome.ok()) return StepStatus(req->job_id(), outcome.status());
  FillStep(std::move(*outcome), resp);
  return grpc::Status::OK;
}

grpc::Status ControllerService::StepStream(grpc::ServerContext* ctx, const baton::v1::StepRequest* req,
                                           grpc::ServerWriter<baton::v1::StepResponse>* writer) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto args = ParseStep(*req);
  if (!args.ok()) return ToGrpcStatus(args.status());
  auto write = [writer](JobManager::StepOutcome&& part) {
    baton::v1::StepResponse resp;
    FillStep(std::move(part), &resp);
    return writer->Write(resp);
  };
  auto outcome = jobs_->Step(req->job_id(), args->steps, args->per_call, args->timeout_ms,
                             AnswerBy(ctx, kMaxStepWait), [ctx] { return ctx->IsCancelled(); }, write);
  if (!outcome.ok()) return StepStatus(req->job_id(), outcome.status());
  write(std::move(*outcome));
  return grpc::Status::OK;
}

grpc::Status ControllerService::KeepAlive(grpc::ServerContext* ctx, const baton::v1::KeepAliveRequest* req,
                                          baton::v1::KeepAliveResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  if (auto job = FindJob(req->job_id()); !job.ok()) return ToGrpcStatus(job.status());
  auto status = jobs_->KeepAlive(req->job_id());
  if (!status.ok()) return ToGrpcStatus(status.status());
  *resp->mutable_job() = *status;
  return grpc::Status::OK;
}

grpc::Status ControllerService::ListJobs(grpc::ServerContext* ctx, const baton::v1::ListJobsRequest* req,
                                         baton::v1::ListJobsResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  if (!req->job_id().empty()) {
    auto job = FindJob(req->job_id());
    if (!job.ok()) return ToGrpcStatus(job.status());
    *resp->add_jobs() = (*job)->status();
    return grpc::Status::OK;
  }
  for (const auto& job : jobs_->Jobs()) *resp->add_jobs() = job->status();
  return grpc::Status::OK;
}

grpc::Status ControllerService::StopJob(grpc::ServerContext* ctx, const baton::v1::StopJobRequest* req,
                                        baton::v1::StopJobResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  if (auto job = FindJob(req->job_id()); !job.ok()) return ToGrpcStatus(job.status());
  auto status = jobs_->Stop(req->job_id(), "stopped by its client (StopJob)");
  if (!status.ok()) return ToGrpcStatus(status.status());
  *resp->mutable_job() = *status;
  return grpc::Status::OK;
}

grpc::Status ControllerService::RescaleJob(grpc::ServerContext* ctx, const baton::v1::RescaleJobRequest* req,
                                           baton::v1::RescaleJobResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  if (auto job = FindJob(req->job_id()); !job.ok()) return ToGrpcStatus(job.status());
  if (req->request_id().size() > kMaxRequestIdBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("request_id is ", req->request_id().size(), " bytes; at most ",
                                     kMaxRequestIdBytes));
  }
  auto status = jobs_->Rescale(req->job_id(), {req->mesh().begin(), req->mesh().end()}, req->request_id());
  if (!status.ok()) return ToGrpcStatus(status.status());
  *resp->mutable_job() = *status;
  return grpc::Status::OK;
}

grpc::Status ControllerService::SaveCheckpoint(grpc::ServerContext* ctx, const baton::v1::SaveCheckpointRequest* req,
                                               baton::v1::SaveCheckpointResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  auto job = FindJob(req->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  auto info = jobs_->Save(req->job_id(), req->dir(), req->async());
  if (!info.ok()) return ToGrpcStatus(info.status());
  *resp->mutable_checkpoint() = *info;
  *resp->mutable_job() = (*job)->status();
  return grpc::Status::OK;
}

grpc::Status ControllerService::WaitCheckpoint(grpc::ServerContext* ctx, const baton::v1::WaitCheckpointRequest* req,
                                               baton::v1::SaveCheckpointResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  if (auto job = FindJob(req->job_id()); !job.ok()) return ToGrpcStatus(job.status());
  const int64_t timeout_ms = req->timeout_ms() > 0 ? std::min(req->timeout_ms(), kDefaultWaitMs) : kDefaultWaitMs;
  auto status = jobs_->AwaitSave(req->job_id(), absl::Milliseconds(timeout_ms));
  if (!status.ok()) return ToGrpcStatus(status.status());
  *resp->mutable_checkpoint() = status->last_checkpoint();
  *resp->mutable_job() = *status;
  return grpc::Status::OK;
}

grpc::Status ControllerService::TraceJob(grpc::ServerContext* ctx, const baton::v1::TraceJobRequest* req,
                                         baton::v1::TraceJobResponse* resp) {
  if (grpc::Status denied = auth_.Check(ctx, Role::kClient); !denied.ok()) return denied;
  if (auto job = FindJob(req->job_id()); !job.ok()) return ToGrpcStatus(job.status());
  auto traced = baton::TraceJob(*jobs_, *meshes_, &newest_trace_, *req);
  if (!traced.ok()) return ToGrpcStatus(traced.status());
  *resp = std::move(*traced);
  return grpc::Status::OK;
}

}  // namespace baton
