// The worker daemon's gRPC service (baton.v1.Worker): it admits a call (the
// fleet's worker token, the call meant for this worker) and hands it to the
// part that owns the state it touches, each with its own lock:
//   MeshHost (worker/mesh_host.h)            the mesh's lifecycle: Configure,
//                                            Abort, GetInfo, RunCollectiveCheck
//   StepExecution (worker/step_execution.h)  the loaded job's steps: LoadProgram,
//                                            RunStep, the step channel's calls
//   StateService (worker/state_service.h)    checkpoints and the state kept
//                                            past a mesh: SaveShards, FinishSave,
//                                            LoadShards, GetRetained, ReadPieces,
//                                            ReleaseState
// as the controller's ControllerService routes to its managers.
//
// Thread-safety: every method may be called concurrently from gRPC's threads.
#ifndef BATON_WORKER_WORKER_SERVICE_H_
#define BATON_WORKER_WORKER_SERVICE_H_

#include <memory>
#include <string>

#include "common/kv_store.h"
#include "proto/worker.grpc.pb.h"
#include "worker/mesh_host.h"
#include "worker/retained_state.h"
#include "worker/state_service.h"
#include "worker/step_execution.h"
#include "worker/worker_options.h"

namespace baton {

class WorkerService final : public baton::v1::Worker::Service {
 public:
  // `rendezvous` must outlive the service. `bind_host` is the address the
  // collectives' transport binds and advertises.
  WorkerService(baton::v1::WorkerInfo identity, Rendezvous* rendezvous, std::string bind_host,
                WorkerOptions options = {});

  // Replaces the identity GetInfo reports (the address is known only once
  // the server is bound).
  void set_identity(const baton::v1::WorkerInfo& identity) { mesh_.set_identity(identity); }
  // The controller is gone (--controller_lost_ms): the current mesh is
  // dropped, its job's state kept (RetainedStates) for the next one.
  void DropMesh(const std::string& reason) { mesh_.DropCurrent(reason); }

  grpc::Status Configure(grpc::ServerContext* ctx, const baton::v1::ConfigureRequest* req,
                         baton::v1::ConfigureResponse* resp) override;
  grpc::Status RunCollectiveCheck(grpc::ServerContext* ctx, const baton::v1::CollectiveCheckRequest* req,
                                  baton::v1::CollectiveCheckResponse* resp) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const baton::v1::AbortRequest* req,
                     baton::v1::AbortResponse* resp) override;
  grpc::Status GetInfo(grpc::ServerContext* ctx, const baton::v1::GetInfoRequest* req,
                       baton::v1::GetInfoResponse* resp) override;
  grpc::Status LoadProgram(grpc::ServerContext* ctx, const baton::v1::LoadProgramRequest* req,
                           baton::v1::LoadProgramResponse* resp) override;
  grpc::Status RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest* req,
                       baton::v1::RunStepResponse* resp) override;
  grpc::Status SaveShards(grpc::ServerContext* ctx, const baton::v1::SaveShardsRequest* req,
                          baton::v1::SaveShardsResponse* resp) override;
  grpc::Status FinishSave(grpc::ServerContext* ctx, const baton::v1::FinishSaveRequest* req,
                          baton::v1::SaveShardsResponse* resp) override;
  grpc::Status LoadShards(grpc::ServerContext* ctx, const baton::v1::LoadShardsRequest* req,
                          baton::v1::LoadShardsResponse* resp) override;
  grpc::Status GetRetained(grpc::ServerContext* ctx, const baton::v1::GetRetainedRequest* req,
                           baton::v1::GetRetainedResponse* resp) override;
  grpc::Status ReadPieces(grpc::ServerContext* ctx, const baton::v1::ReadPiecesRequest* req,
                          baton::v1::ReadPiecesResponse* resp) override;
  grpc::Status ReleaseState(grpc::ServerContext* ctx, const baton::v1::ReleaseStateRequest* req,
                            baton::v1::ReleaseStateResponse* resp) override;

 private:
  // The fleet's worker token, and the call meant for this worker.
  grpc::Status Admit(const grpc::ServerContextBase* ctx);

  const WorkerOptions options_;  // before the parts, which keep a reference
  const std::shared_ptr<RetainedStates> retained_ = std::make_shared<RetainedStates>();
  MeshHost mesh_;
  StepExecution steps_;
  StateService state_;
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_SERVICE_H_
