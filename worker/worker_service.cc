#include "worker/worker_service.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "common/collective_ops.h"
#include "common/file_root.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/process.h"
#include "mesh/device_mesh.h"
#include "common/wire.h"
#include "worker/checkpoint_io.h"
#include "worker/collective_check.h"
#include "worker/rpc_guard.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/mesh_communicators.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/worker_metrics.h"
#include "common/exceptions.h"

namespace baton {
namespace {

constexpr int kMaxCheckIters = 1000;
constexpr int64_t kMaxTimeoutMs = kMaxCheckTimeoutMs;
constexpr int64_t kDefaultRendezvousTimeoutMs = 30000;

int64_t RendezvousTimeoutMs(const baton::v1::ConfigureRequest& req) {
  return req.timeout_ms() > 0 ? req.timeout_ms() : kDefaultRendezvousTimeoutMs;
}

}  // namespace

WorkerService::WorkerService(baton::v1::WorkerInfo identity, Rendezvous* rendezvous,
                             std::string bind_host, WorkerOptions options)
    : rendezvous_(rendezvous),
      bind_host_(std::move(bind_host)),
      options_(std::move(options)),
      identity_(std::move(identity)) {}

void WorkerService::set_identity(const baton::v1::WorkerInfo& identity) {
  absl::MutexLock lock(&mu_);
  identity_ = identity;
}

grpc::Status WorkerService::Admit(const grpc::ServerContextBase* ctx) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  return CheckAddressee(ctx, name());
}

std::string WorkerService::name() {
  absl::MutexLock lock(&mu_);
  return identity_.name();
}

absl::Status WorkerService::ValidateConfigure(const baton::v1::ConfigureRequest& req) {
  const baton::v1::Mesh& m = req.mesh();
  const std::vector<MeshAxisSpec> axes = ToMeshAxes(m.axes());
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
  const int64_t timeout_ms = RendezvousTimeoutMs(req);
  if (timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", timeout_ms, " exceeds ", kMaxTimeoutMs));
  }
  if (req.backend() == baton::v1::NCCL && CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL requested but ", NcclUnavailableReason(1)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<WorkerService::MeshState>> WorkerService::BuildMesh(
    const baton::v1::ConfigureRequest& req) {
  const baton::v1::Mesh& m = req.mesh();
  const std::vector<MeshAxisSpec> axes = ToMeshAxes(m.axes());
  auto mesh = DeviceMesh::Create(axes);
  if (!mesh.ok()) return mesh.status();
  const int64_t timeout_ms = RendezvousTimeoutMs(req);
  auto state = std::make_shared<MeshState>();
  state->mesh = m;
  state->rank = req.rank();
  auto create = [&](const std::string& prefix, int rank,
                    int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
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
  return state;
}

grpc::Status WorkerService::Configure(grpc::ServerContext* ctx, const baton::v1::ConfigureRequest* req,
                                      baton::v1::ConfigureResponse* resp) {
  if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied;
  return Guarded("Configure", [&]() -> grpc::Status {
    if (auto s = ValidateConfigure(*req); !s.ok()) {
      return ToGrpcStatus(absl::Status(
          s.code(), absl::StrCat("worker ", name(), " (rank ", req->rank(), "): ", s.message())));
    }
    int64_t generation;
    std::shared_ptr<MeshState> old;
    {
      absl::MutexLock lock(&mu_);
      generation = ++configure_generation_;
      configuring_epoch_ = req->mesh().epoch();
      old = std::move(current_);  // leave the old mesh before joining the new one
    }
    if (old != nullptr) {
      const std::string reason =
          absl::StrCat("mesh epoch ", old->mesh.epoch(), " replaced by epoch ", req->mesh().epoch());
      ReleaseInBackground(std::move(old), reason);
    }
    auto state = BuildMesh(*req);
    absl::MutexLock lock(&mu_);
    if (generation == configure_generation_) configuring_epoch_ = 0;
    if (!state.ok()) {
      return ToGrpcStatus(absl::Status(
          state.status().code(), absl::StrCat("worker ", identity_.name(), " (rank ", req->rank(),
                                              "): ", state.status().message())));
    }
    if (generation != configure_generation_) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("mesh epoch ", req->mesh().epoch(),
                                       " was aborted or superseded while connecting"));
    }
    current_ = *state;
    resp->set_backend(req->backend() == baton::v1::NCCL ? baton::v1::NCCL : baton::v1::GLOO);
    resp->set_rank(req->rank());
    return grpc::Status::OK;
  });
}

grpc::Status WorkerService::RunCollectiveCheck(grpc::ServerContext* ctx,
                                               const baton::v1::CollectiveCheckRequest* req,
                                               baton::v1::CollectiveCheckResponse* resp) {
  if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied;
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
    auto found = MeshOfEpoch(req->epoch());
    if (!found.ok()) return ToGrpcStatus(found.status());
    std::shared_ptr<MeshState> state = *found;
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
    options.should_stop = [this, ctx, epoch = req->epoch()] {
      if (ctx->IsCancelled()) return true;
      absl::MutexLock lock(&mu_);
      return current_ == nullptr || current_->mesh.epoch() != epoch;
    };
    for (auto& r : RunCollectiveChecks(*it->second, options)) *resp->add_results() = std::move(r);
    return grpc::Status::OK;
  });
}

grpc::Status WorkerService::Abort(grpc::ServerContext* ctx, const baton::v1::AbortRequest* req,
                                  baton::v1::AbortResponse*) {
  if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied;
  std::shared_ptr<MeshState> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr && (req->epoch() == 0 || current_->mesh.epoch() == req->epoch())) {
      dropped = std::move(current_);
    }
    // A rendezvous of this epoch still in progress is discarded when it ends
    // (the controller also poisons its keys so it ends at once).
    if (configuring_epoch_ != 0 && (req->epoch() == 0 || req->epoch() == configuring_epoch_)) {
      ++configure_generation_;
      configuring_epoch_ = 0;
    }
  }
  ReleaseInBackground(std::move(dropped),
                      absl::StrCat("the controller aborted mesh epoch ", req->epoch(),
                                   req->reason().empty() ? "" : absl::StrCat(": ", req->reason())),
                      req->drop_job_state());
  return grpc::Status::OK;
}

void WorkerService::ReleaseInBackground(std::shared_ptr<MeshState> state, const std::string& reason, bool drop_job) {
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
    {
      absl::MutexLock lock(&s->run_mu);
      job_id = s->job_id;
      if (s->executor != nullptr && !drop_job) {
        step = static_cast<int>(s->executor->committed_step());
        store = s->executor->TakeStore();
      }
      s->executor.reset();
    }
    if (drop_job && !job_id.empty()) retained->Release(job_id);
    retained->Keep(job_id, std::move(store), step);
    s.reset();
  }).detach();
}

void WorkerService::DropInBackground(std::shared_ptr<MeshState> state) {
  // Communicators are released when their last user finishes; a gloo
  // destructor may wait for an operation in flight, so never on an RPC thread.
  if (state != nullptr) std::thread([s = std::move(state)]() mutable { s.reset(); }).detach();
}

absl::StatusOr<std::shared_ptr<WorkerService::MeshState>> WorkerService::MeshOfEpoch(int64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr || current_->mesh.epoch() != epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", identity_.name(), " is not configured for mesh epoch ", epoch,
        current_ ? absl::StrCat(" (it is in epoch ", current_->mesh.epoch(), ")") : std::string(" (it is in no mesh)")));
  }
  return current_;
}

grpc::Status WorkerService::LoadProgram(grpc::ServerContext* ctx, const baton::v1::LoadProgramRequest* req,
                                        baton::v1::LoadProgramResponse* resp) {
  if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied;
  return Guarded("LoadProgram", [&]() -> grpc::Status {
    auto state = MeshOfEpoch(req->epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    const baton::v1::Program& program = req->program();
    // A job's token file is opened only under the data root.
    std::optional<baton::v1::Program> confined_copy;
    const baton::v1::Program* confined = &program;
    if (program.data().has_token_file()) {
      auto path = ResolveUnderRoot(options_.data_root, program.data().token_file().path());
      if (!path.ok()) {
        return ToGrpcStatus(absl::Status(path.status().code(),
                                         absl::StrCat("token file: ", path.status().message())));
      }
      confined_copy = program;
      confined_copy->mutable_data()->mutable_token_file()->set_path(*path);
      confined = &*confined_copy;
    }
    if (program.rank() != (*state)->rank) {
      return Invalid(absl::StrCat("program is for rank ", program.rank(), " but this worker is rank ",
                                  (*state)->rank));
    }
    // One job at a time: the previous one's memory goes back before the new
    // one's is allocated, and the new one's growth is measured from here.
    absl::MutexLock lock(&(*state)->run_mu);
    (*state)->executor.reset();
    (*state)->job_id.clear();
    malloc_trim(0);
    ResetPeakMemory();
    const ProcessMemory memory = ReadProcessMemory();
    (*state)->memory_baseline = memory.resident - memory.shared;
    auto executor = Executor::Create(*confined, (*state)->comms);
    if (!executor.ok()) return ToGrpcStatus(executor.status());
    resp->set_state_bytes((*executor)->state_bytes());
    (*state)->job_id = program.job_id();
    (*state)->executor = std::move(*executor);
    return grpc::Status::OK;
  });
}

std::pair<absl::Status, int64_t> WorkerService::RunSteps(MeshState& mesh, const grpc::ServerContext& ctx,
                                                         const baton::v1::RunStepRequest& req,
                                                         baton::v1::RunStepResponse* resp) {
  const int steps = std::max(1, req.steps());
  absl::Status failed;
  int64_t failed_step = 0;
  // On the mesh's own thread: one thread computes every step of a job, one
  // step per call or many (worker/step_thread.h).
  mesh.steps.Run([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // run_mu is held by the caller, who waits
    for (int i = 0; i < steps; ++i) {
      failed_step = req.step() + i;
      if (i > 0 && ctx.IsCancelled()) {
        failed = absl::CancelledError(absl::StrCat("cancelled after ", i, " of ", steps, " steps"));
        return;
      }
      auto metrics = mesh.executor->RunStep(failed_step, Milliseconds(req.timeout_ms()));
      if (!metrics.ok()) {
        failed = metrics.status();
        return;
      }
      // The collectives' shared-memory segments grow only while a job
      // starts (to its largest operation) and are shared with the peers:
      // counted apart from the growth the plan predicts.
      const ProcessMemory memory = ReadProcessMemory();
      metrics->set_memory_growth_bytes(std::max<int64_t>(0, memory.peak - memory.shared - mesh.memory_baseline));
      metrics->set_shared_memory_bytes(memory.shared);
      *resp->add_metrics() = std::move(*metrics);
    }
  });
  return {failed, failed.ok() ? 0 : failed_step};
}

grpc::Status WorkerService::RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest* req,
                                    baton::v1::RunStepResponse* resp) {
  if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied;
  return Guarded("RunStep", [&]() -> grpc::Status {
    if (req->timeout_ms() < 1 || req->timeout_ms() > kMaxTimeoutMs) {
      return Invalid(absl::StrCat("timeout_ms ", req->timeout_ms(), " outside [1, ", kMaxTimeoutMs, "]"));
    }
    if (req->steps() < 0 || req->steps() > kMaxStepsPerRunStep) {
      return Invalid(absl::StrCat("steps ", req->steps(), " outside [0, ", kMaxStepsPerRunStep, "]"));
    }
    auto state = MeshOfEpoch(req->epoch());
    if (!state.ok()) return ToGrpcStatus(state.status());
    std::shared_ptr<MeshState> mesh = std::move(*state);
    absl::Status failed;
    int64_t failed_step = 0;
    {
      absl::MutexLock lock(&mesh->run_mu);
      if (grpc::Status missing = RequireJob(*mesh, req->job_id()); !missing.ok()) return missing;
      std::tie(failed, failed_step) = RunSteps(*mesh, *ctx, *req, resp);
    }
    if (!failed.ok()) {
      Logf("worker %s: job %s step %lld failed: %s", name().c_str(), req->job_id().c_str(),
           static_cast<long long>(failed_step), failed.ToString().c_str());
      if (options_.metrics != nullptr) options_.metrics->ObserveFailedStep(req->job_id());
      // A failed step can leave transfers running under its aborted waits;
      // if the mesh was dropped meanwhile, this is its last reference, and
      // tearing it down waits for them: not before the answer goes out.
      resp->set_rank(mesh->rank);
      resp->set_failed_step(failed_step);
      DropInBackground(std::move(mesh));
      // The steps before the failed one did complete here: their metrics
      // travel in the error's details (a RunStepResponse).
      const grpc::Status status = ToGrpcStatus(failed);
      return grpc::Status(status.error_code(), status.error_message(), resp->SerializeAsString());
    }
    resp->set_rank(mesh->rank);
    if (options_.metrics != nullptr) {
      for (const auto& m : resp->metrics()) options_.metrics->ObserveStep(req->job_id(), m);
    }
    return grpc::Status::OK;
  });
}

grpc::Status WorkerService::GetInfo(grpc::ServerContext* ctx, const baton::v1::GetInfoRequest*,
                                    baton::v1::GetInfoResponse* resp) {
  if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied;
  absl::MutexLock lock(&mu_);
  *resp->mutable_worker() = identity_;
  if (current_ != nullptr) {
    resp->set_epoch(current_->mesh.epoch());
    resp->set_rank(current_->rank);
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::RequireJob(const MeshState& mesh, const std::string& job_id) {
  if (mesh.executor == nullptr || mesh.job_id != job_id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", job_id, " is not loaded on worker ", name()));
  }
  return grpc::Status::OK;
}

}  // namespace baton
