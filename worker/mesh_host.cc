// MeshHost: Configure (checked, then its communicators built),
// RunCollectiveCheck, Abort, GetInfo, and letting a mesh go off the RPC
// threads.
#include "worker/mesh_host.h"

#include <malloc.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/collective_ops.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "mesh/device_mesh.h"
#include "program/wire.h"
#include "worker/collective_check.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/mesh_communicators.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/rpc_guard.h"

namespace baton {
namespace {

constexpr int kMaxCheckIters = 1000;
constexpr int64_t kMaxTimeoutMs = kMaxCheckTimeoutMs;
constexpr int64_t kDefaultRendezvousTimeoutMs = 30000;

int64_t RendezvousTimeoutMs(const baton::v1::ConfigureRequest& req) {
  return req.timeout_ms() > 0 ? req.timeout_ms() : kDefaultRendezvousTimeoutMs;
}

// Drops `last` (a mesh's state: its executor, its communicators) and gives
// the heap that freed back to the system (common/process.h).
template <typename T>
void LetGo(std::shared_ptr<T> last) {
  last.reset();
  malloc_trim(0);
}

}  // namespace

absl::Status MeshHost::ValidateConfigure(const baton::v1::ConfigureRequest& req) {
  const baton::v1::Mesh& m = req.mesh();
  const std::vector<MeshAxisSpec> axes = ToMeshAxes(m.axes());
  auto mesh = DeviceMesh::Create(axes);
  if (!mesh.ok()) return mesh.status();
  if (m.worker_names_size() != mesh->size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh ", FormatMeshSpec(axes), " has ", mesh->size(),
                                                   " ranks but lists ", m.worker_names_size(), " workers"));
  }
  if (req.rank() < 0 || req.rank() >= mesh->size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(), " is out of range for mesh ",
                                                   FormatMeshSpec(axes), " of ", mesh->size(), " ranks"));
  }
  if (m.epoch() <= 0) return absl::InvalidArgumentError("mesh epoch must be positive");
  const int64_t timeout_ms = RendezvousTimeoutMs(req);
  if (timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", timeout_ms, " exceeds ", kMaxTimeoutMs));
  }
  if (req.backend() == baton::v1::NCCL && CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL requested but ", NcclUnavailableReason(1)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<MeshState>> MeshHost::BuildMesh(const baton::v1::ConfigureRequest& req) {
  const baton::v1::Mesh& m = req.mesh();
  const std::vector<MeshAxisSpec> axes = ToMeshAxes(m.axes());
  auto mesh = DeviceMesh::Create(axes);
  if (!mesh.ok()) return mesh.status();
  const int64_t timeout_ms = RendezvousTimeoutMs(req);
  auto state = std::make_shared<MeshState>();
  state->mesh = m;
  state->rank = req.rank();
  auto create = [&](const std::string& prefix, int rank, int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    if (req.backend() == baton::v1::NCCL) {
      NcclOptions options;
      options.device_index = options_.cuda_device;
      options.rendezvous_timeout = Milliseconds(timeout_ms);
      return CreateNcclCommunicator(rendezvous_, prefix, rank, size, options);
    }
    GlooOptions options;
    options.bind_host = bind_host_;
    options.shared_memory = options_.gloo_shared_memory;
    options.rendezvous_timeout = Milliseconds(timeout_ms);
    return CreateGlooCommunicator(rendezvous_, prefix, rank, size, options);
  };
  auto comms = BuildMeshCommunicators(*mesh, req.rank(), absl::StrCat("mesh/", m.epoch(), "/"), create);
  if (!comms.ok()) return comms.status();
  state->comms = std::move(comms->comms);
  state->group_ranks = std::move(comms->group_ranks);
  if (options_.step_channel) {
    MeshState* served = state.get();  // its step thread, which serves the channel, goes first
    auto channel = StepChannelServer::Listen(
        bind_host_, m.epoch(), options_.fleet_credentials,
        [answer = channel_steps_, served](const baton::v1::RunStepRequest& request,
                                          const std::function<bool()>& hung_up, baton::v1::StepChannelReply* reply) {
          answer(*served, request, hung_up, reply);
        });
    if (channel.ok()) {
      state->channel = std::move(*channel);
      state->steps.Serve(state->channel.get());
    } else {
      // The controller calls RunStep over gRPC instead.
      Logf("worker %s: mesh epoch %lld offers no step channel: %s", name().c_str(), static_cast<long long>(m.epoch()),
           channel.status().ToString().c_str());
    }
  }
  return state;
}

grpc::Status MeshHost::Configure(const baton::v1::ConfigureRequest& req, baton::v1::ConfigureResponse* resp) {
  return Guarded("Configure", [&]() -> grpc::Status {
    if (auto s = ValidateConfigure(req); !s.ok()) {
      return ToGrpcStatus(
          absl::Status(s.code(), absl::StrCat("worker ", name(), " (rank ", req.rank(), "): ", s.message())));
    }
    int64_t generation;
    std::shared_ptr<MeshState> old;
    {
      absl::MutexLock lock(&mu_);
      generation = ++configure_generation_;
      configuring_epoch_ = req.mesh().epoch();
      old = std::move(current_);  // leave the old mesh before joining the new one
    }
    if (old != nullptr) {
      const std::string reason =
          absl::StrCat("mesh epoch ", old->mesh.epoch(), " replaced by epoch ", req.mesh().epoch());
      ReleaseInBackground(std::move(old), reason);
    }
    auto state = BuildMesh(req);
    absl::MutexLock lock(&mu_);
    if (generation == configure_generation_) configuring_epoch_ = 0;
    if (!state.ok()) {
      return ToGrpcStatus(absl::Status(
          state.status().code(),
          absl::StrCat("worker ", identity_.name(), " (rank ", req.rank(), "): ", state.status().message())));
    }
    if (generation != configure_generation_) {
      return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("mesh epoch ", req.mesh().epoch(),
                                                                  " was aborted or superseded while connecting"));
    }
    current_ = *state;
    resp->set_backend(req.backend() == baton::v1::NCCL ? baton::v1::NCCL : baton::v1::GLOO);
    resp->set_rank(req.rank());
    if (const StepChannelServer* channel = current_->channel.get(); channel != nullptr) {
      resp->set_step_channel_port(channel->port());
      resp->set_step_channel_secret(channel->secret());
    }
    return grpc::Status::OK;
  });
}

grpc::Status MeshHost::RunCollectiveCheck(const grpc::ServerContext& ctx, const baton::v1::CollectiveCheckRequest& req,
                                          baton::v1::CollectiveCheckResponse* resp) {
  return Guarded("RunCollectiveCheck", [&]() -> grpc::Status {
    if (req.numel() < 0 || req.numel() > kMaxCheckNumel) {
      return Invalid(absl::StrCat("numel ", req.numel(), " outside [0, ", kMaxCheckNumel, "]"));
    }
    if (req.iters() < 1 || req.iters() > kMaxCheckIters) {
      return Invalid(absl::StrCat("iters ", req.iters(), " outside [1, ", kMaxCheckIters, "]"));
    }
    if (req.timeout_ms() < 1 || req.timeout_ms() > kMaxTimeoutMs) {
      return Invalid(absl::StrCat("timeout_ms ", req.timeout_ms(), " outside [1, ", kMaxTimeoutMs, "]"));
    }
    auto found = MeshOfEpoch(req.epoch());
    if (!found.ok()) return ToGrpcStatus(found.status());
    std::shared_ptr<MeshState> state = *found;
    auto it = state->comms.find(req.axis());
    if (it == state->comms.end()) {
      std::string names;
      for (const auto& [name, _] : state->comms) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("unknown mesh axis \"", req.axis(), "\"; axes are [", names, "]"));
    }
    CollectiveCheckOptions options;
    for (int op : req.ops()) {
      if (!baton::v1::CollectiveOp_IsValid(op) || op == baton::v1::COLLECTIVE_OP_UNSPECIFIED) {
        return Invalid(absl::StrCat("unknown collective op ", op));
      }
      options.ops.push_back(static_cast<baton::v1::CollectiveOp>(op));
    }
    options.numel = req.numel();
    options.iters = req.iters();
    options.timeout = Milliseconds(req.timeout_ms());
    options.axis = req.axis();
    options.global_rank = state->rank;
    options.group_ranks = state->group_ranks[req.axis()];
    options.should_stop = [this, &ctx, epoch = req.epoch()] {
      if (ctx.IsCancelled()) return true;
      absl::MutexLock lock(&mu_);
      return current_ == nullptr || current_->mesh.epoch() != epoch;
    };
    for (auto& r : RunCollectiveChecks(*it->second, options)) *resp->add_results() = std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status MeshHost::Abort(const baton::v1::AbortRequest& req) {
  std::shared_ptr<MeshState> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && (req.epoch() == 0 || current_->mesh.epoch() == req.epoch())) {
      dropped = std::move(current_);
    }
    // A rendezvous of this epoch still in progress is discarded when it ends
    // (the controller also poisons its keys so it ends at once).
    if (configuring_epoch_ != 0 && (req.epoch() == 0 || req.epoch() == configuring_epoch_)) {
      ++configure_generation_;
      configuring_epoch_ = 0;
    }
  }
  ReleaseInBackground(std::move(dropped),
                      absl::StrCat("the controller aborted mesh epoch ", req.epoch(),
                                   req.reason().empty() ? "" : absl::StrCat(": ", req.reason())),
                      req.drop_job_state());
  return grpc::Status::OK;
}

void MeshHost::ReleaseInBackground(std::shared_ptr<MeshState> state, const std::string& reason, bool drop_job) {
  if (state == nullptr) return;
  // A step still running on the old mesh (blocked on a peer that is gone,
  // say) ends at once with `reason` instead of at its timeout.
  for (auto& [name, comm] : state->comms) comm->Abort(reason);
  // Its job's state is kept once that step has returned; communicators are
  // released when their last user finishes (a gloo destructor may wait for
  // an operation in flight): both off the RPC thread.
  retained_->Begin();
  std::thread([s = std::move(state), retained = retained_, drop_job]() mutable {
    std::string job_id;
    std::unique_ptr<ShardStore> store;
    int step = 0;
    std::vector<baton::v1::StepMetrics> recent;
    {
      absl::MutexLock lock(&s->run_mu);
      job_id = s->job_id;
      if (s->executor != nullptr && !drop_job) {
        step = static_cast<int>(s->executor->committed_step());
        store = s->executor->TakeStore();
        recent.assign(s->recent.begin(), s->recent.end());
      }
      s->executor.reset();
    }
    if (drop_job && !job_id.empty()) retained->Release(job_id);
    retained->Keep(job_id, std::move(store), step, std::move(recent));
    LetGo(std::move(s));
  }).detach();
}

void MeshHost::DropInBackground(std::shared_ptr<MeshState> state) {
  // Communicators are released when their last user finishes; a gloo
  // destructor may wait for an operation in flight, so never on an RPC thread.
  if (state != nullptr) std::thread([s = std::move(state)]() mutable { LetGo(std::move(s)); }).detach();
}

MeshHost::MeshHost(baton::v1::WorkerInfo identity, Rendezvous* rendezvous, std::string bind_host,
                   const WorkerOptions& options, std::shared_ptr<RetainedStates> retained)
    : rendezvous_(rendezvous),
      bind_host_(std::move(bind_host)),
      options_(options),
      retained_(std::move(retained)),
      identity_(std::move(identity)) {}

void MeshHost::set_identity(const baton::v1::WorkerInfo& identity) {
  absl::MutexLock lock(&mu_);
  identity_ = identity;
}

std::string MeshHost::name() {
  absl::MutexLock lock(&mu_);
  return identity_.name();
}

absl::StatusOr<std::shared_ptr<MeshState>> MeshHost::MeshOfEpoch(int64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr || current_->mesh.epoch() != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", identity_.name(), " is not configured for mesh epoch ", epoch,
                     current_ ? absl::StrCat(" (it is in epoch ", current_->mesh.epoch(), ")")
                              : std::string(" (it is in no mesh)")));
  }
  return current_;
}

grpc::Status MeshHost::GetInfo(baton::v1::GetInfoResponse* resp) {
  absl::MutexLock lock(&mu_);
  *resp->mutable_worker() = identity_;
  if (current_ != nullptr) {
    resp->set_epoch(current_->mesh.epoch());
    resp->set_rank(current_->rank);
  }
  resp->set_now_unix_ns(absl::GetCurrentTimeNanos());  // the controller's clock probes
  return grpc::Status::OK;
}

void MeshHost::DropCurrent(const std::string& reason) {
  std::shared_ptr<MeshState> dropped;
  {
    absl::MutexLock lock(&mu_);
    dropped = std::move(current_);
  }
  if (dropped == nullptr) return;
  Logf("worker %s: mesh epoch %lld dropped: %s", name().c_str(), static_cast<long long>(dropped->mesh.epoch()),
       reason.c_str());
  ReleaseInBackground(std::move(dropped), reason);
}

}  // namespace baton
