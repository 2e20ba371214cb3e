#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "mesh/device_mesh.h"

namespace baton {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

}  // namespace

absl::StatusOr<baton::v1::MeshSpec> ParseMeshSpecProto(const std::string& text) {
  auto axes = ParseMeshSpec(text);
  if (!axes.ok()) return axes.status();
  baton::v1::MeshSpec spec;
  for (const auto& a : *axes) {
    auto* axis = spec.add_axes();
    axis->set_name(a.name);
    axis->set_size(a.size);
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                        absl::Duration timeout) {
  auto credentials = ClientCredentialsFromEnvironment();
  if (!credentials.ok()) return credentials.status();
  return Connect(address, timeout, *credentials);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address, absl::Duration timeout,
                                                        const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // A controller that restarts (on the same address) is found again within
  // a second, not after gRPC's default backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = MakeChannel(address, credentials, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the controller at ", address, " within ",
                     absl::FormatDuration(timeout), "; is `baton up` running?"));
  }
  return std::unique_ptr<Client>(new Client(address, baton::v1::Controller::NewStub(channel)));
}

absl::StatusOr<baton::v1::StatusResponse> Client::Status() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kCallDeadline);
  baton::v1::StatusResponse resp;
  if (auto s = FromGrpcStatus(stub_->Status(&ctx, {}, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<baton::v1::Mesh> Client::CreateMesh(const std::string& spec,
                                                   baton::v1::CommBackend backend,
                                                   absl::Duration deadline) {
  auto parsed = ParseMeshSpecProto(spec);
  if (!parsed.ok()) return parsed.status();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::CreateMeshRequest req;
  *req.mutable_spec() = *parsed;
  req.set_backend(backend);
  baton::v1::CreateMeshResponse resp;
  if (auto s = FromGrpcStatus(stub_->CreateMesh(&ctx, req, &resp)); !s.ok()) return s;
  return resp.mesh();
}

absl::StatusOr<baton::v1::CheckCollectivesResponse> Client::CheckCollectives(
    const baton::v1::CheckCollectivesRequest& request, absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::CheckCollectivesResponse resp;
  if (auto s = FromGrpcStatus(stub_->CheckCollectives(&ctx, request, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<baton::v1::CreateJobResponse> Client::CreateJob(
    const baton::v1::CreateJobRequest& request, absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::CreateJobResponse resp;
  if (auto s = FromGrpcStatus(stub_->CreateJob(&ctx, request, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<baton::v1::StepResponse> Client::Step(const baton::v1::StepRequest& request,
                                                     absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::StepResponse resp;
  if (auto s = FromGrpcStatus(stub_->Step(&ctx, request, &resp)); !s.ok()) return s;
  return resp;
}

absl::Status Client::StepStream(const baton::v1::StepRequest& request,
                                const std::function<bool(const baton::v1::StepResponse&)>& on_part,
                                absl::Duration deadline) {
  grpc::ClientContext ctx;
  if (deadline != absl::InfiniteDuration()) SetDeadline(&ctx, deadline);
  auto reader = stub_->StepStream(&ctx, request);
  baton::v1::StepResponse part;
  bool left = false;
  while (!left && reader->Read(&part)) {
    if (!on_part(part)) {
      ctx.TryCancel();
      left = true;
    }
  }
  grpc::Status s = reader->Finish();
  if (left) return absl::CancelledError("the caller stopped reading the steps");
  return FromGrpcStatus(s);
}

absl::StatusOr<baton::v1::CreateJobResponse> Client::Submit(const baton::v1::CreateJobRequest& request,
                                                            absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::CreateJobResponse resp;
  if (auto s = FromGrpcStatus(stub_->SubmitJob(&ctx, request, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<baton::v1::JobStatus>> Client::Jobs(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kCallDeadline);
  baton::v1::ListJobsRequest req;
  req.set_job_id(job_id);
  baton::v1::ListJobsResponse resp;
  if (auto s = FromGrpcStatus(stub_->ListJobs(&ctx, req, &resp)); !s.ok()) return s;
  return std::vector<baton::v1::JobStatus>(resp.jobs().begin(), resp.jobs().end());
}

absl::StatusOr<baton::v1::JobStatus> Client::GetJob(const std::string& job_id) {
  auto jobs = Jobs(job_id);
  if (!jobs.ok()) return jobs.status();
  if (jobs->size() != 1) return absl::NotFoundError(absl::StrCat("unknown job \"", job_id, "\""));
  return jobs->front();
}

absl::Status Client::Logs(const std::string& job_id, int64_t after_sequence, bool follow,
                          const std::function<bool(const baton::v1::JobLogEntry&)>& on_entry,
                          absl::Duration duration) {
  grpc::ClientContext ctx;
  if (duration != absl::InfiniteDuration()) SetDeadline(&ctx, duration);
  baton::v1::JobLogsRequest req;
  req.set_job_id(job_id);
  req.set_after_sequence(after_sequence);
  req.set_follow(follow);
  auto reader = stub_->JobLogs(&ctx, req);
  baton::v1::JobLogEntry e;
  while (reader->Read(&e)) {
    if (!on_entry(e)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return FromGrpcStatus(s);
}

absl::StatusOr<baton::v1::JobStatus> Client::KeepAlive(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kCallDeadline);
  baton::v1::KeepAliveRequest req;
  req.set_job_id(job_id);
  baton::v1::KeepAliveResponse resp;
  if (auto s = FromGrpcStatus(stub_->KeepAlive(&ctx, req, &resp)); !s.ok()) return s;
  return resp.job();
}

absl::StatusOr<baton::v1::StopJobResponse> Client::StopJob(const std::string& job_id, absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::StopJobRequest req;
  req.set_job_id(job_id);
  baton::v1::StopJobResponse resp;
  if (auto s = FromGrpcStatus(stub_->StopJob(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<baton::v1::JobStatus> Client::RescaleJob(const std::string& job_id, const std::string& mesh,
                                                        absl::Duration wait) {
  auto spec = ParseMeshSpecProto(mesh);
  if (!spec.ok()) return spec.status();
  baton::v1::RescaleJobRequest req;
  req.set_job_id(job_id);
  *req.mutable_mesh() = spec->axes();
  // The idempotency key: asked again after a lost answer (a controller
  // that went away mid-call), the controller says what became of this
  // request rather than taking it as a second one.
  std::random_device random;
  req.set_request_id(absl::StrFormat("%08x%08x", random(), random()));
  const absl::Time until = absl::Now() + std::max(wait, absl::Seconds(20));
  baton::v1::RescaleJobResponse resp;
  for (;;) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(20));
    absl::Status s = FromGrpcStatus(stub_->RescaleJob(&ctx, req, &resp));
    if (s.ok()) break;
    if (!absl::IsUnavailable(s) || absl::Now() > until) return s;
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (wait <= absl::ZeroDuration()) return resp.job();
  const absl::Time wait_until = absl::Now() + wait;
  for (;;) {
    auto job = GetJob(job_id);
    if (job.ok()) {
      const baton::v1::RescaleState& r = job->rescale();
      if (r.request_id() != req.request_id()) {
        return absl::AbortedError(absl::StrCat("job ", job_id, " was rescaled by another request (",
                                               r.request_id(), ") before this one was applied"));
      }
      if (r.phase() == baton::v1::RescaleState::APPLIED && job->state() == baton::v1::JOB_RUNNING) return *job;
      if (r.phase() == baton::v1::RescaleState::FAILED) {
        return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " was not rescaled to ", mesh, ": ",
                                                          r.error()));
      }
    } else if (!absl::IsUnavailable(job.status())) {
      return job.status();
    }
    if (absl::Now() > wait_until) {
      return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " is not running on ", mesh, " after ",
                                                      absl::FormatDuration(wait)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<baton::v1::SaveCheckpointResponse> Client::SaveCheckpoint(const std::string& job_id,
                                                                         const std::string& dir, bool async,
                                                                         absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  baton::v1::SaveCheckpointRequest req;
  req.set_job_id(job_id);
  req.set_dir(dir);
  req.set_async(async);
  baton::v1::SaveCheckpointResponse resp;
  if (auto s = FromGrpcStatus(stub_->SaveCheckpoint(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<baton::v1::TraceJobResponse> Client::TraceJob(const std::string& job_id, int steps, bool start_only,
                                                             absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout + absl::Seconds(15));  // and the clocks' probes
  baton::v1::TraceJobRequest req;
  req.set_job_id(job_id);
  req.set_steps(steps);
  req.set_start_only(start_only);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  baton::v1::TraceJobResponse resp;
  if (auto s = FromGrpcStatus(stub_->TraceJob(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<baton::v1::SaveCheckpointResponse> Client::WaitCheckpoint(const std::string& job_id,
                                                                         absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline + absl::Seconds(5));
  baton::v1::WaitCheckpointRequest req;
  req.set_job_id(job_id);
  req.set_timeout_ms(absl::ToInt64Milliseconds(deadline));
  baton::v1::SaveCheckpointResponse resp;
  if (auto s = FromGrpcStatus(stub_->WaitCheckpoint(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::Status Client::Watch(int64_t after_sequence,
                           const std::function<bool(const baton::v1::Event&)>& on_event,
                           absl::Duration duration) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, duration);
  baton::v1::WatchRequest req;
  req.set_after_sequence(after_sequence);
  auto reader = stub_->Watch(&ctx, req);
  baton::v1::Event e;
  while (reader->Read(&e)) {
    if (!on_event(e)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      s.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::OkStatus();
  }
  return FromGrpcStatus(s);
}

absl::Status Client::WaitForWorkers(int n, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  int alive = 0;
  while (true) {
    auto status = Status();
    if (status.ok()) {
      alive = 0;
      for (const auto& w : status->workers()) alive += w.state() != baton::v1::DEAD;
      if (alive >= n) return absl::OkStatus();
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", alive, " of ", n, " workers registered within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace baton
