#include "client/job.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_state.h"

namespace baton {
namespace {

// How long a handle going away waits to release its job.
constexpr absl::Duration kReleaseDeadline = absl::Seconds(3);

}  // namespace

absl::Status Job::ExplainLostCall(Client* client, const std::string& job_id, const absl::Status& s,
                                  absl::Duration wait) {
  // The controller's own answers about a job name it; a transport failure
  // (the connection reset, the controller gone) does not.
  if (s.code() != absl::StatusCode::kUnavailable || absl::StartsWith(s.message(), "job ")) return s;
  const absl::Time give_up = absl::Now() + wait;
  while (absl::Now() < give_up) {
    auto job = client->GetJob(job_id);
    if (job.ok()) {
      if (!IsEnded(job->state())) return s;  // a blip: the job goes on
      return absl::FailedPreconditionError(absl::StrCat("lost the controller during the call (", s.message(),
                                                        "); job ", job_id, " is now ",
                                                        baton::v1::JobState_Name(job->state()), ": ", job->error()));
    }
    if (job.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat("lost the controller during the call (", s.message(),
                                              "); the controller that answers now does not know job ", job_id,
                                              " (it restarted without a --state_dir)"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return s;
}

absl::StatusOr<std::unique_ptr<Job>> Job::Create(Client* client, const baton::v1::JobSpec& spec,
                                                 baton::v1::CommBackend backend, absl::Duration lease) {
  baton::v1::CreateJobRequest req;
  *req.mutable_job() = spec;
  req.set_backend(backend);
  req.set_lease_ms(absl::ToInt64Milliseconds(lease));
  auto created = client->CreateJob(req);
  if (!created.ok()) return created.status();
  return std::unique_ptr<Job>(new Job(client, std::move(*created)));
}

absl::StatusOr<std::unique_ptr<Job>> Job::Restore(Client* client, baton::v1::JobSpec spec, const std::string& dir,
                                                  baton::v1::CommBackend backend) {
  spec.set_resume_from(dir);
  spec.clear_init_from();
  return Create(client, spec, backend);
}

absl::StatusOr<std::vector<baton::v1::StepMetrics>> Job::Step(int n, int steps_per_call) {
  baton::v1::StepRequest req;
  req.set_job_id(id_);
  req.set_steps(n);
  req.set_steps_per_call(steps_per_call);
  auto resp = client_->Step(req);
  if (!resp.ok()) return ExplainLostCall(client_, id_, resp.status());
  status_ = resp->job();
  std::vector<baton::v1::StepMetrics> out(resp->metrics().begin(), resp->metrics().end());
  metrics_.insert(metrics_.end(), out.begin(), out.end());
  return out;
}

absl::StatusOr<baton::v1::TraceJobResponse> Job::Trace(int n, int steps_per_call) {
  // Armed first, so the steps this handle runs next are the ones recorded.
  if (auto armed = client_->TraceJob(id_, n, /*start_only=*/true); !armed.ok()) return armed.status();
  if (auto stepped = Step(n, steps_per_call); !stepped.ok()) return stepped.status();
  return client_->TraceJob(id_, n);
}

absl::StatusOr<baton::v1::CheckpointInfo> Job::Save(const std::string& dir, bool async) {
  auto resp = client_->SaveCheckpoint(id_, dir, async);
  if (!resp.ok()) return resp.status();
  status_ = resp->job();
  return resp->checkpoint();
}

absl::StatusOr<baton::v1::CheckpointInfo> Job::WaitForSave() {
  auto resp = client_->WaitCheckpoint(id_);
  if (!resp.ok()) return resp.status();
  status_ = resp->job();
  return resp->checkpoint();
}

absl::Status Job::KeepAlive() {
  auto status = client_->KeepAlive(id_);
  if (!status.ok()) return status.status();
  status_ = *status;
  return absl::OkStatus();
}

Job::~Job() {
  if (!stopped_) client_->StopJob(id_, kReleaseDeadline).IgnoreError();
}

absl::Status Job::Stop() {
  auto resp = client_->StopJob(id_);
  if (!resp.ok()) return resp.status();
  stopped_ = true;
  status_ = resp->job();
  return absl::OkStatus();
}

}  // namespace baton
