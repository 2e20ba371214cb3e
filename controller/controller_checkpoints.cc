// ControllerService's checkpoints: SaveCheckpoint, WaitCheckpoint, the
// periodic saves of Step, and resume_from / init_from at CreateJob.
//
// A save: the planner names the pieces each rank writes (strategies/
// checkpoint_plan.h); every writing rank writes one data file
// (Worker.SaveShards); once all have, the controller writes the metadata
// last (checkpoint/files.h: temporary name, fsync, rename). A rank that dies
// midway leaves data files no metadata names: the previous checkpoint of
// that step (if any) stays the one that exists, and the orphans are removed
// by the next save of that directory.
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "common/file_root.h"
#include "common/grpc_status.h"
#include "controller/controller_service.h"
#include "google/protobuf/util/message_differencer.h"
#include "strategies/checkpoint_plan.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

constexpr absl::Duration kSaveDeadline = absl::Minutes(10);
constexpr absl::Duration kLoadDeadline = absl::Minutes(10);
constexpr int64_t kDefaultWaitMs = 600000;

// Unique per save, so a save never overwrites the files of a published
// checkpoint of the same step: the new metadata replaces the old at once.
std::string NewSaveId() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%x-%08x", absl::ToUnixMillis(absl::Now()), static_cast<uint32_t>(rng()));
}

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

// The call whose failure caused the others (those it cancelled say
// CANCELLED), or -1 when every call succeeded.
template <typename Resp>
int FirstFailure(const std::vector<CallResult<Resp>>& results) {
  for (bool cancelled : {false, true}) {
    for (size_t i = 0; i < results.size(); ++i) {
      const grpc::Status& s = results[i].status;
      if (!s.ok() && (s.error_code() == grpc::StatusCode::CANCELLED) == cancelled) return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<ControllerService::Restore> ControllerService::ReadRestore(baton::v1::JobSpec& job) {
  Restore restore;
  if (!job.resume_from().empty() && !job.init_from().empty()) {
    return absl::InvalidArgumentError("a job takes resume_from or init_from, not both");
  }
  if (!job.resume_from().empty()) {
    auto dir = ResolveUnderRoot(options_.file_root, job.resume_from());
    if (!dir.ok()) return absl::Status(dir.status().code(), absl::StrCat("resume_from: ", dir.status().message()));
    auto found = FindCheckpoint(*dir);
    if (!found.ok()) return absl::Status(found.status().code(), absl::StrCat("resume_from: ", found.status().message()));
    auto md = ReadMetadata(*found);
    if (!md.ok()) return absl::Status(md.status().code(), absl::StrCat("resume_from: ", md.status().message()));
    const baton::v1::ModelSpec saved = WithDefaults(md->job()).model();
    if (!google::protobuf::util::MessageDifferencer::Equals(saved, job.model())) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: the checkpoint at ", *found,
                                                     " was saved from another model: {", saved.ShortDebugString(),
                                                     "}; this job's is {", job.model().ShortDebugString(), "}"));
    }
    if (md->step() > job.steps()) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: the checkpoint is at step ", md->step(),
                                                     " but the job runs only to step ", job.steps()));
    }
    // The seed fixes the data each step reads: the resumed run continues
    // the saved one's stream.
    job.set_seed(md->seed());
    restore.dir = *found;
    restore.metadata = std::move(*md);
    restore.optimizer = true;
    restore.info.set_step(restore.metadata.step());
  } else if (!job.init_from().empty()) {
    auto path = ResolveUnderRoot(options_.file_root, job.init_from());
    if (!path.ok()) return absl::Status(path.status().code(), absl::StrCat("init_from: ", path.status().message()));
    auto md = ReadSafetensors(*path);
    if (!md.ok()) return absl::Status(md.status().code(), absl::StrCat("init_from: ", md.status().message()));
    restore.dir = path->substr(0, path->rfind('/'));
    restore.metadata = std::move(*md);
    restore.info.set_path(*path);
    return restore;
  } else {
    return restore;
  }
  restore.info.set_path(restore.dir);
  return restore;
}

absl::StatusOr<baton::v1::CheckpointInfo> ControllerService::LoadRestore(
    const Restore& restore, const std::vector<std::vector<baton::v1::ShardRead>>& plan, const baton::v1::Mesh& mesh,
    const std::string& job_id) {
  const absl::Time started = absl::Now();
  std::vector<std::string> addresses(mesh.worker_addresses().begin(), mesh.worker_addresses().end());
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*, const baton::v1::LoadShardsRequest&,
                             baton::v1::LoadShardsResponse*)>
      load = [](auto* stub, auto* ctx, const auto& r, auto* out) { return stub->LoadShards(ctx, r, out); };
  std::string abort_reason;
  auto results = dispatcher_.Call<baton::v1::LoadShardsRequest, baton::v1::LoadShardsResponse>(
      addresses, load,
      [&](size_t r) {
        baton::v1::LoadShardsRequest req;
        req.set_epoch(mesh.epoch());
        req.set_job_id(job_id);
        req.set_step(restore.metadata.step());
        *req.mutable_reads() = {plan[r].begin(), plan[r].end()};
        return req;
      },
      kLoadDeadline + options_.rpc_slack, [&] { return DeadWorkerIn(mesh); }, &abort_reason);
  baton::v1::CheckpointInfo info = restore.info;
  if (const int r = FirstFailure(results); r >= 0) {
    const grpc::Status& s = results[r].status;
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("loading ", restore.info.path(), " on ", WorkerLabel(mesh, r),
                                     " failed: ", s.error_message()));
  }
  for (const auto& r : results) info.set_bytes(info.bytes() + r.response.bytes_read());
  if (!abort_reason.empty()) return absl::UnavailableError(abort_reason);
  info.set_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  return info;
}

absl::StatusOr<baton::v1::CheckpointInfo> ControllerService::SaveJob(const JobRecord& job, const std::string& dir,
                                                                    bool async) {
  FinishInFlightSave();  // at most one save in flight
  if (dir.empty()) {
    return absl::InvalidArgumentError("no checkpoint directory: give one, or set checkpoint.dir in the job");
  }
  auto root_dir = ResolveUnderRoot(options_.file_root, dir);
  if (!root_dir.ok()) return root_dir.status();
  {
    absl::MutexLock lock(&mu_);
    if (current_.epoch() != job.mesh.epoch()) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job.status.job_id(),
                                                        "'s mesh is gone (aborted or replaced): nothing to save"));
    }
  }
  if (job.programs == nullptr) return absl::FailedPreconditionError("job has no Programs");
  auto plan = PlanSave(*job.programs);
  if (!plan.ok()) return plan.status();
  const int step = job.status.step();
  const std::string step_dir = absl::StrCat(*root_dir, "/", StepDirName(step));
  if (auto s = MakeDirs(step_dir); !s.ok()) return s;
  const std::string save_id = NewSaveId();
  const absl::Time started = absl::Now();
  const baton::v1::Mesh& mesh = job.mesh;
  std::vector<std::string> addresses;
  std::vector<int> ranks;  // ranks with something to write
  for (size_t r = 0; r < plan->size(); ++r) {
    if ((*plan)[r].empty()) continue;
    addresses.push_back(mesh.worker_addresses(static_cast<int>(r)));
    ranks.push_back(static_cast<int>(r));
  }
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*, const baton::v1::SaveShardsRequest&,
                             baton::v1::SaveShardsResponse*)>
      save = [](auto* stub, auto* ctx, const auto& r, auto* out) { return stub->SaveShards(ctx, r, out); };
  std::string abort_reason;
  auto written = dispatcher_.Call<baton::v1::SaveShardsRequest, baton::v1::SaveShardsResponse>(
      addresses, save,
      [&](size_t i) {
        baton::v1::SaveShardsRequest req;
        req.set_epoch(mesh.epoch());
        req.set_job_id(job.status.job_id());
        req.set_step(step);
        req.set_file(DataFileName(ranks[i], save_id));
        req.set_path(absl::StrCat(step_dir, "/", req.file()));
        *req.mutable_writes() = {(*plan)[ranks[i]].begin(), (*plan)[ranks[i]].end()};
        req.set_block_bytes(options_.checkpoint_block_bytes);
        req.set_async(async);
        return req;
      },
      kSaveDeadline + options_.rpc_slack, [&] { return DeadWorkerIn(mesh); }, &abort_reason);
  if (const int i = FirstFailure(written); i >= 0) {
    const grpc::Status& s = written[i].status;
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("saving ", step_dir, ": ", WorkerLabel(mesh, ranks[i]), ": ", s.error_message(),
                                     " (the checkpoint was not published)"));
  }
  if (!abort_reason.empty()) {
    return absl::UnavailableError(absl::StrCat("saving ", step_dir, ": ", abort_reason, " (not published)"));
  }
  if (!async) return PublishSave(job, step_dir, *root_dir, written, started, false, 0);

  // Async: every worker has its pieces in host memory; training may go on.
  const double copy_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  auto flight = std::make_shared<SaveInFlight>();
  flight->job_id = job.status.job_id();
  flight->step = step;
  {
    absl::MutexLock lock(&mu_);
    save_in_flight_ = flight;
    if (job_.status.job_id() == job.status.job_id()) job_.status.set_checkpoint_in_flight_step(step);
  }
  flight->thread = std::thread([this, job, step_dir, root_dir = *root_dir, addresses, ranks, step, started,
                                copy_seconds, f = flight.get()] {
    std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*, const baton::v1::FinishSaveRequest&,
                               baton::v1::SaveShardsResponse*)>
        finish = [](auto* stub, auto* ctx, const auto& r, auto* out) { return stub->FinishSave(ctx, r, out); };
    std::string reason;
    auto done = dispatcher_.Call<baton::v1::FinishSaveRequest, baton::v1::SaveShardsResponse>(
        addresses, finish,
        [&](size_t) {
          baton::v1::FinishSaveRequest req;
          req.set_epoch(job.mesh.epoch());
          req.set_job_id(job.status.job_id());
          req.set_step(step);
          req.set_timeout_ms(absl::ToInt64Milliseconds(kSaveDeadline));
          return req;
        },
        kSaveDeadline + options_.rpc_slack, [&] { return DeadWorkerIn(job.mesh); }, &reason);
    std::string error = reason;
    if (const int i = FirstFailure(done); i >= 0 && error.empty()) {
      error = absl::StrCat(WorkerLabel(job.mesh, ranks[i]), ": ", done[i].status.error_message());
    }
    absl::StatusOr<baton::v1::CheckpointInfo> published =
        error.empty() ? PublishSave(job, step_dir, root_dir, done, started, true, copy_seconds)
                      : absl::StatusOr<baton::v1::CheckpointInfo>(absl::UnavailableError(error));
    {
      absl::MutexLock lock(&mu_);
      if (job_.status.job_id() == job.status.job_id()) {
        job_.status.set_checkpoint_in_flight_step(0);
        if (!published.ok()) {
          job_.status.set_checkpoint_error(absl::StrCat("async save of step ", step, " to ", step_dir,
                                                        " failed (not published): ", published.status().message()));
        }
      }
    }
    if (!published.ok()) {
      events_->Append("checkpoint_failed", "", -1,
                      absl::StrCat(job.status.job_id(), " step ", step, ": ", published.status().message()));
    }
    f->done.Notify();
  });
  baton::v1::CheckpointInfo info;
  info.set_path(step_dir);
  info.set_step(step);
  info.set_async(true);
  info.set_copy_seconds(copy_seconds);
  return info;
}

absl::StatusOr<baton::v1::CheckpointInfo> ControllerService::PublishSave(
    const JobRecord& job, const std::string& step_dir, const std::string& root_dir,
    const std::vector<CallResult<baton::v1::SaveShardsResponse>>& written, absl::Time started, bool async,
    double copy_seconds) {
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_step(job.status.step());
  md.set_seed(job.spec.seed());
  *md.mutable_job() = job.spec;
  md.set_block_bytes(options_.checkpoint_block_bytes);
  md.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  std::map<std::string, baton::v1::CheckpointTensor*> tensors;
  for (const auto& w : written) {
    for (const auto& t : w.response.written()) {
      auto& entry = tensors[t.name()];
      if (entry == nullptr) {
        entry = md.add_tensors();
        entry->set_name(t.name());
        entry->set_dtype(t.dtype());
        *entry->mutable_shape() = t.shape();
      }
      for (const auto& c : t.chunks()) {
        *entry->add_chunks() = c;
        md.set_total_bytes(md.total_bytes() + c.length());
      }
    }
  }
  if (auto s = CheckMetadata(md); !s.ok()) return s;
  if (auto s = PublishMetadata(step_dir, md); !s.ok()) return s;
  // Published: the save's time ends here; what follows is clean-up.
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  RemoveUnreferencedFiles(step_dir, md);
  // keep_last, in the job's own checkpoint.dir only (a save elsewhere, a
  // milestone, prunes nothing): the newest checkpoints by step stay, never
  // the one just written goes.
  const int keep = job.spec.checkpoint().keep_last();
  auto own_dir = job.spec.checkpoint().dir().empty()
                     ? absl::StatusOr<std::string>(absl::NotFoundError("none"))
                     : ResolveUnderRoot(options_.file_root, job.spec.checkpoint().dir());
  if (keep > 0 && own_dir.ok() && *own_dir == root_dir) {
    auto all = ListCheckpoints(root_dir);
    int extra = static_cast<int>(all.size()) - keep;
    for (size_t i = 0; i < all.size() && extra > 0; ++i) {
      if (all[i].second == step_dir) continue;
      if (RemoveCheckpoint(all[i].second).ok()) {
        --extra;
        events_->Append("checkpoint_removed", "", -1, absl::StrCat(all[i].second, " (keep_last ", keep, ")"));
      }
    }
  }
  baton::v1::CheckpointInfo info;
  info.set_path(step_dir);
  info.set_step(md.step());
  info.set_bytes(md.total_bytes());
  info.set_seconds(seconds);
  info.set_async(async);
  info.set_copy_seconds(copy_seconds);
  {
    absl::MutexLock lock(&mu_);
    if (job_.status.job_id() == job.status.job_id()) {
      *job_.status.mutable_last_checkpoint() = info;
      job_.status.clear_checkpoint_error();
    }
  }
  events_->Append("checkpoint_saved", "", -1,
                  absl::StrFormat("%s step %d: %s, %d bytes in %.3f s", job.status.job_id(), md.step(), step_dir,
                                  md.total_bytes(), info.seconds()));
  return info;
}

void ControllerService::FinishInFlightSave() {
  std::shared_ptr<SaveInFlight> flight;
  {
    absl::MutexLock lock(&mu_);
    flight = save_in_flight_;
  }
  if (flight == nullptr) return;
  flight->done.WaitForNotification();  // bounded: its FinishSave calls have deadlines
  bool mine = false;
  {
    absl::MutexLock lock(&mu_);
    if (save_in_flight_ == flight) {
      save_in_flight_ = nullptr;
      mine = true;
    }
  }
  if (mine && flight->thread.joinable()) flight->thread.join();
}

grpc::Status ControllerService::SaveCheckpoint(grpc::ServerContext* ctx, const baton::v1::SaveCheckpointRequest* req,
                                               baton::v1::SaveCheckpointResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  absl::MutexLock op(&op_mu_);
  JobRecord job;
  {
    absl::MutexLock lock(&mu_);
    job = job_;
  }
  if (job.status.job_id().empty() || job.status.job_id() != req->job_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown job \"", req->job_id(), "\""));
  }
  if (job.status.state() == baton::v1::JOB_FAILED) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job ", job.status.job_id(), " FAILED: its state is not trustworthy to save"));
  }
  const std::string dir = req->dir().empty() ? job.spec.checkpoint().dir() : req->dir();
  auto info = SaveJob(job, dir, req->async());
  if (!info.ok()) return Error(info.status());
  *resp->mutable_checkpoint() = *info;
  absl::MutexLock lock(&mu_);
  *resp->mutable_job() = job_.status;
  return grpc::Status::OK;
}

grpc::Status ControllerService::WaitCheckpoint(grpc::ServerContext* ctx, const baton::v1::WaitCheckpointRequest* req,
                                               baton::v1::SaveCheckpointResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  {
    absl::MutexLock lock(&mu_);
    if (job_.status.job_id().empty() || job_.status.job_id() != req->job_id()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown job \"", req->job_id(), "\""));
    }
  }
  std::shared_ptr<SaveInFlight> flight;
  {
    absl::MutexLock lock(&mu_);
    flight = save_in_flight_;
  }
  const int64_t timeout_ms = req->timeout_ms() > 0 ? req->timeout_ms() : kDefaultWaitMs;
  if (flight != nullptr && !flight->done.WaitForNotificationWithTimeout(absl::Milliseconds(timeout_ms))) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("the async save of step ", flight->step, " is still in flight"));
  }
  absl::MutexLock lock(&mu_);
  *resp->mutable_checkpoint() = job_.status.last_checkpoint();
  *resp->mutable_job() = job_.status;
  if (!job_.status.checkpoint_error().empty()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, job_.status.checkpoint_error());
  }
  return grpc::Status::OK;
}

}  // namespace baton
