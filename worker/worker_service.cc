#include "worker/worker_service.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "mesh/device_mesh.h"
#include "worker/collective_check.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/nccl/nccl_communicator.h"

namespace baton {
namespace {

// Bounds on what one RunCollectiveCheck may ask for: 64 Mi elements is 256 MiB
// of fp32 per buffer, and a check holds a few buffers at once.
constexpr int64_t kMaxCheckNumel = int64_t{64} << 20;
constexpr int kMaxCheckIters = 1000;
constexpr int64_t kMaxTimeoutMs = 600000;
constexpr int64_t kDefaultRendezvousTimeoutMs = 30000;

grpc::Status Invalid(const std::string& msg) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg);
}

// Runs `body`, turning any exception (LibTorch throws c10::Error) into a
// status that names the RPC instead of letting it cross the RPC boundary.
template <typename F>
grpc::Status Guarded(const char* rpc, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(rpc, ": ", what));
  }
}

}  // namespace

WorkerService::WorkerService(baton::v1::WorkerInfo identity, Rendezvous* rendezvous,
                             std::string bind_host)
    : rendezvous_(rendezvous), bind_host_(std::move(bind_host)), identity_(std::move(identity)) {}

void WorkerService::set_identity(const baton::v1::WorkerInfo& identity) {
  absl::MutexLock lock(&mu_);
  identity_ = identity;
}

std::string WorkerService::name() {
  absl::MutexLock lock(&mu_);
  return identity_.name();
}

absl::StatusOr<std::shared_ptr<WorkerService::MeshState>> WorkerService::BuildMesh(
    const baton::v1::ConfigureRequest& req) {
  const baton::v1::Mesh& m = req.mesh();
  std::vector<MeshAxisSpec> axes;
  for (const auto& a : m.axes()) axes.push_back({a.name(), a.size()});
  auto mesh = DeviceMesh::Create(axes);
  if (!mesh.ok()) return mesh.status();
  if (m.worker_names_size() != mesh->size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh ", FormatMeshSpec(axes), " has ",
                                                   mesh->size(), " ranks but lists ",
                                                   m.worker_names_size(), " workers"));
  }
  if (req.rank() < 0 || req.rank() >= mesh->size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(), " is out of range for mesh ",
                                                   FormatMeshSpec(axes), " of ", mesh->size(),
                                                   " ranks"));
  }
  if (m.epoch() <= 0) return absl::InvalidArgumentError("mesh epoch must be positive");
  const int64_t timeout_ms = req.timeout_ms() > 0 ? req.timeout_ms() : kDefaultRendezvousTimeoutMs;
  if (timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", timeout_ms, " exceeds ", kMaxTimeoutMs));
  }

  auto state = std::make_shared<MeshState>();
  state->mesh = m;
  state->rank = req.rank();
  const std::string base = absl::StrCat("mesh/", m.epoch(), "/");
  auto create = [&](const std::string& prefix, int rank,
                    int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    if (req.backend() == baton::v1::NCCL) {
      NcclOptions options;
      options.rendezvous_timeout = Milliseconds(timeout_ms);
      return CreateNcclCommunicator(rendezvous_, prefix, rank, size, options);
    }
    GlooOptions options;
    options.bind_host = bind_host_;
    options.rendezvous_timeout = Milliseconds(timeout_ms);
    return CreateGlooCommunicator(rendezvous_, prefix, rank, size, options);
  };
  // Same order on every rank: world first, then the axes in mesh order.
  auto world = create(base + "world/", req.rank(), mesh->size());
  if (!world.ok()) return world.status();
  state->comms["world"] = std::move(*world);
  state->group_ranks["world"] = mesh->ranks();
  for (const auto& axis : axes) {
    auto groups = *mesh->Groups(axis.name);
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), req.rank());
      if (it == groups[g].end()) continue;
      int local = static_cast<int>(it - groups[g].begin());
      auto comm = create(absl::StrCat(base, axis.name, "/", g, "/"), local, axis.size);
      if (!comm.ok()) return comm.status();
      state->comms[axis.name] = std::move(*comm);
      state->group_ranks[axis.name] = groups[g];
    }
  }
  return state;
}

grpc::Status WorkerService::Configure(grpc::ServerContext*, const baton::v1::ConfigureRequest* req,
                                      baton::v1::ConfigureResponse* resp) {
  return Guarded("Configure", [&]() -> grpc::Status {
    {
      absl::MutexLock lock(&mu_);
      if (req->mesh().epoch() < requested_epoch_) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("mesh epoch ", req->mesh().epoch(),
                                         " is older than the current ", requested_epoch_));
      }
      requested_epoch_ = req->mesh().epoch();
      current_.reset();  // leave the old mesh before joining the new one
    }
    auto state = BuildMesh(*req);
    if (!state.ok()) {
      return ToGrpcStatus(absl::Status(
          state.status().code(), absl::StrCat("worker ", name(), " (rank ", req->rank(),
                                              "): ", state.status().message())));
    }
    absl::MutexLock lock(&mu_);
    if (requested_epoch_ != req->mesh().epoch()) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("mesh epoch ", req->mesh().epoch(), " was superseded by ",
                                       requested_epoch_));
    }
    current_ = *state;
    resp->set_backend(req->backend() == baton::v1::NCCL ? baton::v1::NCCL : baton::v1::GLOO);
    resp->set_rank(req->rank());
    return grpc::Status::OK;
  });
}

grpc::Status WorkerService::RunCollectiveCheck(grpc::ServerContext*,
                                               const baton::v1::CollectiveCheckRequest* req,
                                               baton::v1::CollectiveCheckResponse* resp) {
  return Guarded("RunCollectiveCheck", [&]() -> grpc::Status {
    if (req->numel() < 0 || req->numel() > kMaxCheckNumel) {
      return Invalid(absl::StrCat("numel ", req->numel(), " outside [0, ", kMaxCheckNumel, "]"));
    }
    if (req->iters() < 1 || req->iters() > kMaxCheckIters) {
      return Invalid(absl::StrCat("iters ", req->iters(), " outside [1, ", kMaxCheckIters, "]"));
    }
    if (req->timeout_ms() < 1 || req->timeout_ms() > kMaxTimeoutMs) {
      return Invalid(absl::StrCat("timeout_ms ", req->timeout_ms(), " outside [1, ", kMaxTimeoutMs, "]"));
    }
    std::shared_ptr<MeshState> state;
    {
      absl::MutexLock lock(&mu_);
      state = current_;
    }
    if (state == nullptr || state->mesh.epoch() != req->epoch()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("worker ", name(), " is not configured for mesh epoch ",
                                       req->epoch(), state ? absl::StrCat(" (it is in epoch ", state->mesh.epoch(), ")")
                                                           : std::string(" (it is in no mesh)")));
    }
    auto it = state->comms.find(req->axis());
    if (it == state->comms.end()) {
      std::string names;
      for (const auto& [name, _] : state->comms) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("unknown mesh axis \"", req->axis(), "\"; axes are [", names, "]"));
    }
    CollectiveCheckOptions options;
    for (int op : req->ops()) {
      if (!baton::v1::CollectiveOp_IsValid(op) || op == baton::v1::COLLECTIVE_OP_UNSPECIFIED) {
        return Invalid(absl::StrCat("unknown collective op ", op));
      }
      options.ops.push_back(static_cast<baton::v1::CollectiveOp>(op));
    }
    options.numel = req->numel();
    options.iters = req->iters();
    options.timeout = Milliseconds(req->timeout_ms());
    options.axis = req->axis();
    options.global_rank = state->rank;
    options.group_ranks = state->group_ranks[req->axis()];
    for (auto& r : RunCollectiveChecks(*it->second, options)) *resp->add_results() = std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status WorkerService::Abort(grpc::ServerContext*, const baton::v1::AbortRequest* req,
                                  baton::v1::AbortResponse*) {
  std::shared_ptr<MeshState> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && (req->epoch() == 0 || current_->mesh.epoch() == req->epoch())) {
      dropped = std::move(current_);
    }
    // Also cancels a rendezvous of this epoch that is still in progress.
    if (req->epoch() == 0 || req->epoch() >= requested_epoch_) {
      requested_epoch_ = std::max(requested_epoch_, req->epoch() + 1);
    }
  }
  // Communicators are released when their last user finishes; with gloo a
  // destructor may wait for an operation in flight, so do it off this thread.
  if (dropped != nullptr) std::thread([d = std::move(dropped)]() mutable { d.reset(); }).detach();
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetInfo(grpc::ServerContext*, const baton::v1::GetInfoRequest*,
                                    baton::v1::GetInfoResponse* resp) {
  absl::MutexLock lock(&mu_);
  *resp->mutable_worker() = identity_;
  if (current_ != nullptr) {
    resp->set_epoch(current_->mesh.epoch());
    resp->set_rank(current_->rank);
  }
  return grpc::Status::OK;
}

}  // namespace baton
