#include "client/job.h"

#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<std::unique_ptr<Job>> Job::Create(Client* client, const baton::v1::JobSpec& spec,
                                                 baton::v1::CommBackend backend) {
  baton::v1::CreateJobRequest req;
  *req.mutable_job() = spec;
  req.set_backend(backend);
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

absl::StatusOr<std::vector<baton::v1::StepMetrics>> Job::Step(int n) {
  baton::v1::StepRequest req;
  req.set_job_id(id_);
  req.set_steps(n);
  auto resp = client_->Step(req);
  if (!resp.ok()) return resp.status();
  status_ = resp->job();
  std::vector<baton::v1::StepMetrics> out(resp->metrics().begin(), resp->metrics().end());
  metrics_.insert(metrics_.end(), out.begin(), out.end());
  return out;
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

absl::Status Job::Stop() {
  auto resp = client_->StopJob(id_);
  if (!resp.ok()) return resp.status();
  status_ = resp->job();
  return absl::OkStatus();
}

}  // namespace baton
