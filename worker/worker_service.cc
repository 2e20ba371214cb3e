#include "worker/worker_service.h"

#include <utility>

#include "common/security.h"

namespace baton {

WorkerService::WorkerService(baton::v1::WorkerInfo identity, Rendezvous* rendezvous, std::string bind_host,
                             WorkerOptions options)
    : options_(std::move(options)),
      mesh_(std::move(identity), rendezvous, std::move(bind_host), options_, retained_),
      steps_(&mesh_, options_),
      state_(&mesh_, options_, retained_) {
  mesh_.set_channel_steps(
      [this](MeshState& mesh, const baton::v1::RunStepRequest& req, const std::function<bool()>& hung_up,
             baton::v1::StepChannelReply* reply) { steps_.AnswerChannelStep(mesh, req, hung_up, reply); });
}

grpc::Status WorkerService::Admit(const grpc::ServerContextBase* ctx) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kWorker); !denied.ok()) return denied;
  return CheckAddressee(ctx, mesh_.name());
}

// Each call: admitted, then handed to the part that owns what it touches.
#define BATON_ROUTE(call)                                              \
  do {                                                                 \
    if (grpc::Status denied = Admit(ctx); !denied.ok()) return denied; \
    return call;                                                       \
  } while (false)

grpc::Status WorkerService::Configure(grpc::ServerContext* ctx, const baton::v1::ConfigureRequest* req,
                                      baton::v1::ConfigureResponse* resp) {
  BATON_ROUTE(mesh_.Configure(*req, resp));
}
grpc::Status WorkerService::RunCollectiveCheck(grpc::ServerContext* ctx, const baton::v1::CollectiveCheckRequest* req,
                                               baton::v1::CollectiveCheckResponse* resp) {
  BATON_ROUTE(mesh_.RunCollectiveCheck(*ctx, *req, resp));
}
grpc::Status WorkerService::Abort(grpc::ServerContext* ctx, const baton::v1::AbortRequest* req,
                                  baton::v1::AbortResponse*) {
  BATON_ROUTE(mesh_.Abort(*req));
}
grpc::Status WorkerService::GetInfo(grpc::ServerContext* ctx, const baton::v1::GetInfoRequest*,
                                    baton::v1::GetInfoResponse* resp) {
  BATON_ROUTE(mesh_.GetInfo(resp));
}
grpc::Status WorkerService::LoadProgram(grpc::ServerContext* ctx, const baton::v1::LoadProgramRequest* req,
                                        baton::v1::LoadProgramResponse* resp) {
  BATON_ROUTE(steps_.LoadProgram(*req, resp));
}
grpc::Status WorkerService::RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest* req,
                                    baton::v1::RunStepResponse* resp) {
  BATON_ROUTE(steps_.RunStep(*ctx, *req, resp));
}
grpc::Status WorkerService::SaveShards(grpc::ServerContext* ctx, const baton::v1::SaveShardsRequest* req,
                                       baton::v1::SaveShardsResponse* resp) {
  BATON_ROUTE(state_.SaveShards(*req, resp));
}
grpc::Status WorkerService::FinishSave(grpc::ServerContext* ctx, const baton::v1::FinishSaveRequest* req,
                                       baton::v1::SaveShardsResponse* resp) {
  BATON_ROUTE(state_.FinishSave(*req, resp));
}
grpc::Status WorkerService::LoadShards(grpc::ServerContext* ctx, const baton::v1::LoadShardsRequest* req,
                                       baton::v1::LoadShardsResponse* resp) {
  BATON_ROUTE(state_.LoadShards(*req, resp));
}
grpc::Status WorkerService::GetRetained(grpc::ServerContext* ctx, const baton::v1::GetRetainedRequest* req,
                                        baton::v1::GetRetainedResponse* resp) {
  BATON_ROUTE(state_.GetRetained(*req, resp));
}
grpc::Status WorkerService::ReadPieces(grpc::ServerContext* ctx, const baton::v1::ReadPiecesRequest* req,
                                       baton::v1::ReadPiecesResponse* resp) {
  BATON_ROUTE(state_.ReadPieces(*req, resp));
}
grpc::Status WorkerService::ReleaseState(grpc::ServerContext* ctx, const baton::v1::ReleaseStateRequest* req,
                                         baton::v1::ReleaseStateResponse* resp) {
  BATON_ROUTE(state_.ReleaseState(*req, resp));
}

#undef BATON_ROUTE

}  // namespace baton
