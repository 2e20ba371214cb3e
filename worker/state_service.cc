// StateService: checkpoint saves and loads, and the state a worker keeps
// past its mesh (GetRetained, ReadPieces, ReleaseState) for recovery and
// rescale worker to worker.
#include "worker/state_service.h"

#include <chrono>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "common/collective_ops.h"
#include "common/file_root.h"
#include "common/grpc_status.h"
#include "common/security.h"
#include "common/text.h"
#include "proto/worker.grpc.pb.h"
#include "worker/checkpoint_io.h"
#include "worker/rpc_guard.h"
#include "worker/step_tracer.h"

namespace baton {
namespace {

constexpr int64_t kMaxTimeoutMs = kMaxCheckTimeoutMs;
constexpr int64_t kMinBlockBytes = 4096;  // and at most checkpoint/layout.h's kMaxBlockBytes
// How long a new save waits for the previous async one to finish writing.
constexpr absl::Duration kPendingSaveWait = absl::Minutes(10);
// How long GetRetained waits at most for a copy still being taken, and a
// peer's ReadPieces may take.
constexpr int64_t kMaxRetainedWaitMs = 60000;
constexpr absl::Duration kPeerReadDeadline = absl::Seconds(60);

}  // namespace

absl::StatusOr<baton::v1::SaveShardsResponse> StateService::AwaitPendingSave(MeshState& state,
                                                                             std::shared_ptr<PendingSave> pending,
                                                                             absl::Duration timeout) {
  // Steps go on while the writer writes: the run lock is not held here.
  if (!pending->done.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("the async save of step ", pending->step,
                                                    " is still writing after ", absl::FormatDuration(timeout)));
  }
  absl::MutexLock lock(&state.run_mu);
  if (state.pending_save == pending) state.pending_save = nullptr;
  return pending->result;
}

grpc::Status StateService::SaveShards(const baton::v1::SaveShardsRequest& req, baton::v1::SaveShardsResponse* resp) {
  return Guarded("SaveShards", [&]() -> grpc::Status {
    if (req.block_bytes() < kMinBlockBytes || req.block_bytes() > kMaxBlockBytes) {
      return Invalid(
          absl::StrCat("block_bytes ", req.block_bytes(), " outside [", kMinBlockBytes, ", ", kMaxBlockBytes, "]"));
    }
    auto path = ResolveUnderRoot(options_.file_root, req.path());
    if (!path.ok()) return ToGrpcStatus(path.status());
    if (req.file().empty() || req.file().find('/') != std::string::npos) {
      return Invalid(absl::StrCat("file name \"", req.file(), "\" must be a plain name"));
    }
    auto state = host_->MeshOfEpoch(req.epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    std::shared_ptr<MeshState> mesh = std::move(*state);
    absl::MutexLock lock(&mesh->run_mu);
    if (grpc::Status missing = RequireJob(*mesh, req.job_id(), host_->name()); !missing.ok()) return missing;
    if (mesh->executor->step() != req.step()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("worker ", host_->name(), " is at step ", mesh->executor->step(),
                                       ", the save is of step ", req.step()));
    }
    // At most one async save in flight: the previous one finishes first.
    while (std::shared_ptr<PendingSave> previous = mesh->pending_save) {
      mesh->run_mu.Unlock();
      auto waited = AwaitPendingSave(*mesh, previous, kPendingSaveWait);
      mesh->run_mu.Lock();
      if (!waited.ok() && absl::IsDeadlineExceeded(waited.status())) return ToGrpcStatus(waited.status());
      if (mesh->executor == nullptr || mesh->job_id != req.job_id() || mesh->executor->step() != req.step()) {
        return grpc::Status(grpc::StatusCode::ABORTED, "the job changed while waiting for the previous save");
      }
    }
    const std::string dir = path->substr(0, path->rfind('/'));
    if (auto s = MakeDirs(dir); !s.ok()) return ToGrpcStatus(s);
    const auto start = std::chrono::steady_clock::now();
    const int64_t start_ns = StepTracer::NowNs();
    auto pieces = CollectPieces(mesh->executor->store(), req.writes(), req.async());
    if (!pieces.ok()) return ToGrpcStatus(pieces.status());
    if (!req.async()) {
      auto written = WritePieces(*path, req.file(), *pieces, req.block_bytes(), options_.testing_write_delay_ms);
      if (!written.ok()) return ToGrpcStatus(written.status());
      *resp = *written;
      for (baton::v1::TraceSpan& span : *resp->mutable_io()) span.set_step(req.step());
      return grpc::Status::OK;
    }
    auto pending = std::make_shared<PendingSave>();
    pending->job_id = req.job_id();
    pending->step = req.step();
    resp->set_copy_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    baton::v1::TraceSpan* copy = resp->add_io();
    *copy = IoSpan("checkpoint copy", start_ns);
    copy->set_step(req.step());
    pending->writer =
        std::thread([pending = pending.get(), pieces = std::move(*pieces), path = *path, file = req.file(),
                     block_bytes = req.block_bytes(), delay = options_.testing_write_delay_ms]() mutable {
          try {
            pending->result = WritePieces(path, file, pieces, block_bytes, delay);
          } catch (const std::exception& e) {
            pending->result = absl::InternalError(absl::StrCat("writing ", path, ": ", e.what()));
          }
          pieces.clear();  // the host copy goes as soon as it is written
          pending->done.Notify();
        });
    mesh->pending_save = std::move(pending);
    return grpc::Status::OK;
  });
}

grpc::Status StateService::FinishSave(const baton::v1::FinishSaveRequest& req, baton::v1::SaveShardsResponse* resp) {
  return Guarded("FinishSave", [&]() -> grpc::Status {
    if (req.timeout_ms() < 1 || req.timeout_ms() > kMaxTimeoutMs) {
      return Invalid(absl::StrCat("timeout_ms ", req.timeout_ms(), " outside [1, ", kMaxTimeoutMs, "]"));
    }
    auto state = host_->MeshOfEpoch(req.epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    std::shared_ptr<MeshState> mesh = std::move(*state);
    std::shared_ptr<PendingSave> pending;
    {
      absl::MutexLock lock(&mesh->run_mu);
      pending = mesh->pending_save;
    }
    if (pending == nullptr || pending->job_id != req.job_id() || pending->step != req.step()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("worker ", host_->name(), " has no save of job ",
                                                                    req.job_id(), " step ", req.step(), " in flight"));
    }
    auto result = AwaitPendingSave(*mesh, pending, absl::Milliseconds(req.timeout_ms()));
    if (!result.ok()) return ToGrpcStatus(result.status());
    *resp = *result;
    for (baton::v1::TraceSpan& span : *resp->mutable_io()) span.set_step(req.step());
    return grpc::Status::OK;
  });
}

grpc::Status StateService::LoadShards(const baton::v1::LoadShardsRequest& req, baton::v1::LoadShardsResponse* resp) {
  return Guarded("LoadShards", [&]() -> grpc::Status {
    auto state = host_->MeshOfEpoch(req.epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    std::shared_ptr<MeshState> mesh = std::move(*state);
    absl::MutexLock lock(&mesh->run_mu);
    if (grpc::Status missing = RequireJob(*mesh, req.job_id(), host_->name()); !missing.ok()) return missing;
    if (mesh->executor->step() != 0 || req.step() < 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", req.job_id(), " already ran ", mesh->executor->step(),
                                       " steps; a checkpoint loads into a job before its first step"));
    }
    absl::StatusOr<LoadTotals> totals;
    try {
      totals = baton::LoadShards(mesh->executor->store(), req.reads(), options_.file_root,
                                 [this](const baton::v1::PeerSource& peer,
                                        const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes) {
                                   return FetchPieces(peer, boxes);
                                 });
    } catch (const std::exception& e) {
      totals = absl::InternalError(FirstLine(e));
    }
    if (!totals.ok()) {
      // Partly overwritten: the job must not run on it.
      mesh->executor = nullptr;
      mesh->job_id.clear();
      return ToGrpcStatus(absl::Status(
          totals.status().code(),
          absl::StrCat("worker ", host_->name(), " (rank ", mesh->rank, "): ", totals.status().message())));
    }
    mesh->executor->ResumeAt(req.step());
    resp->set_bytes_read(totals->disk);
    const std::string me = host_->name();
    for (const auto& [holder, bytes] : totals->by_peer) {
      if (holder == me) {
        resp->set_bytes_local(resp->bytes_local() + bytes);
      } else {
        resp->set_bytes_from_peers(resp->bytes_from_peers() + bytes);
      }
    }
    return grpc::Status::OK;
  });
}

grpc::Status StateService::GetRetained(const baton::v1::GetRetainedRequest& req, baton::v1::GetRetainedResponse* resp) {
  if (req.wait_ms() < 0 || req.wait_ms() > kMaxRetainedWaitMs) {
    return Invalid(absl::StrCat("wait_ms ", req.wait_ms(), " outside [0, ", kMaxRetainedWaitMs, "]"));
  }
  if (absl::Status id = CheckJobId(req.job_id()); !id.ok()) return ToGrpcStatus(id);
  std::shared_ptr<const RetainedStates::Held> held = retained_->Get(req.job_id(), absl::Milliseconds(req.wait_ms()));
  if (held != nullptr) {
    resp->set_held(true);
    resp->set_step(held->step);
    resp->set_bytes(held->bytes);
    for (const auto& m : held->recent) {
      if (m.step() > req.figures_after()) *resp->add_figures() = m;
    }
  }
  return grpc::Status::OK;
}

grpc::Status StateService::ReadPieces(const baton::v1::ReadPiecesRequest& req, baton::v1::ReadPiecesResponse* resp) {
  return Guarded("ReadPieces", [&]() -> grpc::Status {
    auto values = ReadRetained(req.job_id(), req.step(), req.boxes());
    if (!values.ok()) return ToGrpcStatus(values.status());
    for (auto& v : *values) resp->add_values(std::move(v));
    return grpc::Status::OK;
  });
}

absl::StatusOr<std::vector<std::string>> StateService::ReadRetained(
    const std::string& job_id, int step, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes) {
  // Checked before anything reads or echoes it (a 15 MiB id took 34 s).
  if (absl::Status id = CheckJobId(job_id); !id.ok()) return id;
  std::shared_ptr<const RetainedStates::Held> held = retained_->Get(job_id, absl::ZeroDuration());
  if (held == nullptr)
    return absl::NotFoundError(absl::StrCat("worker ", host_->name(), " keeps no state of job ", job_id));
  if (held->step != step) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", host_->name(), " keeps job ", job_id, " at step ", held->step, ", not ", step));
  }
  return ReadBoxes(*held->store, boxes);
}

grpc::Status StateService::ReleaseState(const baton::v1::ReleaseStateRequest& req,
                                        baton::v1::ReleaseStateResponse* resp) {
  if (absl::Status id = CheckJobId(req.job_id()); !id.ok()) return ToGrpcStatus(id);
  resp->set_bytes(retained_->Release(req.job_id()));
  return grpc::Status::OK;
}

absl::StatusOr<std::vector<std::string>> StateService::FetchPieces(
    const baton::v1::PeerSource& peer, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes) {
  if (peer.worker() == host_->name()) return ReadRetained(peer.job_id(), peer.step(), boxes);
  std::shared_ptr<grpc::Channel> channel;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<grpc::Channel>& cached = peer_channels_[peer.address()];
    if (cached == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);  // ReadPieces answers up to ReadBoxes' bound
      cached = MakeChannel(peer.address(), options_.fleet_credentials, args);
    }
    channel = cached;
  }
  auto stub = baton::v1::Worker::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(kPeerReadDeadline));
  ctx.AddMetadata(kAddresseeMetadata, peer.worker());
  baton::v1::ReadPiecesRequest req;
  req.set_job_id(peer.job_id());
  req.set_step(peer.step());
  *req.mutable_boxes() = boxes;
  baton::v1::ReadPiecesResponse resp;
  if (grpc::Status s = stub->ReadPieces(&ctx, req, &resp); !s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("reading job ", peer.job_id(), "'s state from ", peer.worker(), " at ",
                                     peer.address(), ": ", s.error_message()));
  }
  return std::vector<std::string>(std::make_move_iterator(resp.mutable_values()->begin()),
                                  std::make_move_iterator(resp.mutable_values()->end()));
}

}  // namespace baton
