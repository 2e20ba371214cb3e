#include "controller/checkpoint_coordinator.h"

#include <dirent.h>
#include <unistd.h>

#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/files.h"
#include "checkpoint/layout.h"
#include "common/file_root.h"
#include "strategies/checkpoint_plan.h"
#include "strategies/job_spec.h"

namespace baton {
namespace {

// Unique per save, so a save never overwrites the files of a published
// checkpoint of the same step: the new metadata replaces the old at once.
std::string NewSaveId() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%x-%08x", absl::ToUnixMillis(absl::Now()), static_cast<uint32_t>(rng()));
}

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

CheckpointCoordinator::CheckpointCoordinator(Job* job, MeshManager* meshes, EventLog* events,
                                             CheckpointOptions options,
                                             std::function<void(const std::string&)> published)
    : job_(job), meshes_(meshes), events_(events), options_(std::move(options)), published_(std::move(published)) {}

CheckpointCoordinator::~CheckpointCoordinator() { JoinInFlight(); }

absl::StatusOr<baton::v1::CheckpointInfo> CheckpointCoordinator::Load(const RestorePlan& plan,
                                                                     const baton::v1::Mesh& mesh,
                                                                     const std::string& not_live) {
  const absl::Time started = absl::Now();
  std::string abort_reason;
  FanOut fan_out;
  fan_out.deadline = kLoadDeadline + options_.rpc_slack;
  fan_out.should_abort = [&] { return meshes_->DeadWorkerIn(mesh); };
  auto results = meshes_->dispatcher()->Call<LoadShardsRpc>(
      MeshManager::Targets(mesh),
      [&](size_t r) {
        baton::v1::LoadShardsRequest req;
        req.set_epoch(mesh.epoch());
        req.set_job_id(job_->id());
        req.set_step(plan.metadata.step());
        *req.mutable_reads() = {plan.reads[r].begin(), plan.reads[r].end()};
        return req;
      },
      fan_out, &abort_reason);
  if (const int r = FirstFailure(results); r >= 0) {
    const grpc::Status& s = results[r].status;
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("loading ", plan.info.from_peers() ? "from live workers" : plan.info.path(),
                                     " on ", WorkerLabel(mesh, r), " failed: ", s.error_message()));
  }
  if (!abort_reason.empty()) return absl::UnavailableError(abort_reason);
  baton::v1::CheckpointInfo info = plan.info;
  for (const auto& r : results) {
    info.set_bytes(info.bytes() + r.response.bytes_read());
    info.set_bytes_from_peers(info.bytes_from_peers() + r.response.bytes_from_peers());
    info.set_bytes_local(info.bytes_local() + r.response.bytes_local());
  }
  info.set_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  events_->Append(JobEvent(
      baton::v1::Event::JOB_RESTORED, job_->id(), info.step(),
      info.from_peers()
          ? absl::StrFormat("from live workers: %d bytes from peers, %d kept in place, %d from disk in %.3f s",
                            info.bytes_from_peers(), info.bytes_local(), info.bytes(), info.seconds())
          : absl::StrFormat("from %s: %d bytes in %.3f s%s", info.path(), info.bytes(), info.seconds(),
                            not_live.empty() ? "" : absl::StrCat(" (not from live workers: ", not_live, ")"))));
  return info;
}

void CheckpointCoordinator::JoinInFlight() {
  std::shared_ptr<InFlight> flight;
  {
    absl::MutexLock lock(&mu_);
    flight = std::move(in_flight_);
  }
  if (flight == nullptr) return;
  flight->done.WaitForNotification();  // bounded: its FinishSave calls have deadlines
  if (flight->thread.joinable()) flight->thread.join();
}

absl::Status CheckpointCoordinator::AwaitInFlight(absl::Duration timeout) {
  std::shared_ptr<InFlight> flight;
  {
    absl::MutexLock lock(&mu_);
    flight = in_flight_;
  }
  if (flight != nullptr && !flight->done.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("the async save of step ", flight->step, " is still in flight"));
  }
  return absl::OkStatus();
}

void CheckpointCoordinator::Record(const absl::StatusOr<baton::v1::CheckpointInfo>& outcome, int step, bool periodic) {
  if (outcome.ok()) {
    job_->RecordCheckpoint(*outcome);
    events_->Append(JobEvent(baton::v1::Event::CHECKPOINT_SAVED, job_->id(), step,
                             absl::StrFormat("%s: %d bytes in %.3f s%s", outcome->path(), outcome->bytes(),
                                             outcome->seconds(), outcome->async() ? " (async)" : "")));
    return;
  }
  const std::string why = std::string(outcome.status().message());
  job_->RecordCheckpointFailure(why, periodic);
  events_->Append(JobEvent(baton::v1::Event::CHECKPOINT_FAILED, job_->id(), step, "", why));
}

void CheckpointCoordinator::RemoveFailedSave(const std::string& step_dir, const std::vector<std::string>& files) {
  for (const std::string& f : files) ::unlink(absl::StrCat(step_dir, "/", f).c_str());
  ::rmdir(step_dir.c_str());  // only when empty: an earlier checkpoint of the step stays
}

absl::StatusOr<baton::v1::CheckpointInfo> CheckpointCoordinator::Save(const baton::v1::Mesh& mesh,
                                                                     const std::string& dir, bool async,
                                                                     bool periodic) {
  JoinInFlight();  // at most one save in flight
  const int step = job_->step();
  auto fail = [&](const absl::Status& s) -> absl::StatusOr<baton::v1::CheckpointInfo> {
    Record(s, step, periodic);
    return s;
  };
  if (dir.empty()) {
    return fail(absl::InvalidArgumentError("no checkpoint directory: give one, or set checkpoint.dir in the job"));
  }
  auto root_dir = ResolveUnderRoot(options_.file_root, dir);
  if (!root_dir.ok()) return fail(root_dir.status());
  if (!meshes_->Intact(mesh)) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("job ", job_->id(), "'s mesh is gone (aborted or replaced): nothing to save")));
  }
  auto plan = PlanSave(job_->plan()->programs);
  if (!plan.ok()) return fail(plan.status());
  const std::string step_dir = absl::StrCat(*root_dir, "/", StepDirName(step));
  if (auto s = MakeDirs(step_dir); !s.ok()) return fail(s);
  const std::string save_id = NewSaveId();
  const absl::Time started = absl::Now();
  std::vector<WorkerTarget> addresses;
  std::vector<std::string> files;
  std::vector<int> ranks;  // ranks with something to write
  for (size_t r = 0; r < plan->size(); ++r) {
    if ((*plan)[r].empty()) continue;
    addresses.push_back({mesh.worker_names(static_cast<int>(r)), mesh.worker_addresses(static_cast<int>(r))});
    ranks.push_back(static_cast<int>(r));
    files.push_back(DataFileName(static_cast<int>(r), save_id));
  }
  std::string abort_reason;
  FanOut fan_out;
  fan_out.deadline = kSaveDeadline + options_.rpc_slack;
  fan_out.should_abort = [&] { return meshes_->DeadWorkerIn(mesh); };
  auto written = meshes_->dispatcher()->Call<SaveShardsRpc>(
      addresses,
      [&](size_t i) {
        baton::v1::SaveShardsRequest req;
        req.set_epoch(mesh.epoch());
        req.set_job_id(job_->id());
        req.set_step(step);
        req.set_file(files[i]);
        req.set_path(absl::StrCat(step_dir, "/", files[i]));
        *req.mutable_writes() = {(*plan)[ranks[i]].begin(), (*plan)[ranks[i]].end()};
        req.set_block_bytes(options_.block_bytes);
        req.set_async(async);
        return req;
      },
      fan_out, &abort_reason);
  absl::Status failed;
  if (const int i = FirstFailure(written); i >= 0) {
    const grpc::Status& s = written[i].status;
    failed = absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("saving step ", step, " to ", step_dir, ": ", WorkerLabel(mesh, ranks[i]), ": ",
                                       s.error_message(), " (not published; its files removed)"));
  } else if (!abort_reason.empty()) {
    failed = absl::UnavailableError(
        absl::StrCat("saving step ", step, " to ", step_dir, ": ", abort_reason, " (not published; its files removed)"));
  }
  if (!failed.ok()) {
    RemoveFailedSave(step_dir, files);
    return fail(failed);
  }
  TraceIo(mesh, step, ranks, written);
  if (!async) {
    auto published = Publish(step_dir, *root_dir, written, step, started, false, 0);
    if (!published.ok()) RemoveFailedSave(step_dir, files);
    Record(published, step, periodic);
    return published;
  }
  // Async: every worker has its pieces in host memory; training may go on.
  const double copy_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  auto flight = std::make_shared<InFlight>();
  flight->step = step;
  job_->SetCheckpointInFlight(step);
  InFlight* f = flight.get();
  flight->thread = std::thread([this, mesh, step_dir, root_dir = *root_dir, addresses, ranks, files, step, started,
                                copy_seconds, periodic, f] {
    std::string reason;
    FanOut finish;
    finish.deadline = kSaveDeadline + options_.rpc_slack;
    finish.should_abort = [&] { return meshes_->DeadWorkerIn(mesh); };
    auto done = meshes_->dispatcher()->Call<FinishSaveRpc>(
        addresses,
        [&](size_t) {
          baton::v1::FinishSaveRequest req;
          req.set_epoch(mesh.epoch());
          req.set_job_id(job_->id());
          req.set_step(step);
          req.set_timeout_ms(absl::ToInt64Milliseconds(kSaveDeadline));
          return req;
        },
        finish, &reason);
    if (const int i = FirstFailure(done); i >= 0 && reason.empty()) {
      reason = absl::StrCat(WorkerLabel(mesh, ranks[i]), ": ", done[i].status.error_message());
    }
    if (reason.empty()) TraceIo(mesh, step, ranks, done);
    absl::StatusOr<baton::v1::CheckpointInfo> published =
        reason.empty() ? Publish(step_dir, root_dir, done, step, started, true, copy_seconds)
                       : absl::StatusOr<baton::v1::CheckpointInfo>(absl::UnavailableError(
                             absl::StrCat("async save of step ", step, " to ", step_dir, " failed: ", reason,
                                          " (not published; its files removed)")));
    if (!published.ok()) RemoveFailedSave(step_dir, files);
    job_->SetCheckpointInFlight(0);
    Record(published, step, periodic);
    f->done.Notify();
  });
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = std::move(flight);
  }
  baton::v1::CheckpointInfo info;
  info.set_path(step_dir);
  info.set_step(step);
  info.set_async(true);
  info.set_copy_seconds(copy_seconds);
  return info;
}

void CheckpointCoordinator::TraceIo(const baton::v1::Mesh& mesh, int step, const std::vector<int>& ranks,
                                    const std::vector<CallResult<baton::v1::SaveShardsResponse>>& answers) {
  std::vector<std::vector<baton::v1::TraceSpan>> by_rank(mesh.worker_names_size());
  for (size_t i = 0; i < answers.size() && i < ranks.size(); ++i) {
    if (ranks[i] < static_cast<int>(by_rank.size())) {
      by_rank[ranks[i]].assign(answers[i].response.io().begin(), answers[i].response.io().end());
    }
  }
  job_->trace().AddIo(mesh.epoch(), step, by_rank);
}

absl::StatusOr<baton::v1::CheckpointInfo> CheckpointCoordinator::Publish(
    const std::string& step_dir, const std::string& root_dir,
    const std::vector<CallResult<baton::v1::SaveShardsResponse>>& written, int step, absl::Time started, bool async,
    double copy_seconds) {
  baton::v1::CheckpointMetadata md;
  md.set_version(kCheckpointVersion);
  md.set_step(step);
  md.set_seed(job_->status().data_seed());
  *md.mutable_job() = *job_->placement()->spec;  // the mesh it was saved from
  md.set_block_bytes(options_.block_bytes);
  md.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  md.set_job_id(job_->id());
  md.set_job_fingerprint(JobFingerprint(job_->spec()));
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
  if (published_) published_(step_dir);
  // Published: the save's time ends here; what follows is clean-up.
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  RemoveUnreferencedFiles(step_dir, md);
  // keep_last, in the job's own checkpoint.dir only (a save elsewhere, a
  // milestone, prunes nothing), and of the checkpoints it saved itself (a
  // directory an earlier job used keeps that job's): the newest by step
  // stay, never the one just written goes.
  const int keep = job_->spec().checkpoint().keep_last();
  auto own_dir = job_->spec().checkpoint().dir().empty()
                     ? absl::StatusOr<std::string>(absl::NotFoundError("none"))
                     : ResolveUnderRoot(options_.file_root, job_->spec().checkpoint().dir());
  if (keep > 0 && own_dir.ok() && *own_dir == root_dir) {
    std::vector<std::pair<int, std::string>> all;
    for (auto& c : ListCheckpoints(root_dir)) {
      auto saved = ReadMetadata(c.second);
      if (saved.ok() && SavedBy(*saved, md.job_id(), md.job_fingerprint())) all.push_back(std::move(c));
    }
    int extra = static_cast<int>(all.size()) - keep;
    for (size_t i = 0; i < all.size() && extra > 0; ++i) {
      if (all[i].second == step_dir) continue;
      if (RemoveCheckpoint(all[i].second).ok()) {
        --extra;
        events_->Append(JobEvent(baton::v1::Event::CHECKPOINT_REMOVED, job_->id(), all[i].first,
                                 absl::StrCat(all[i].second, " (keep_last ", keep, ")")));
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
  return info;
}

}  // namespace baton
