// StateService: the job's state beyond its steps - checkpoints (SaveShards,
// FinishSave, LoadShards; the bytes: worker/checkpoint_io.h) and the state a
// worker keeps past its mesh for recovery and rescale worker to worker
// (GetRetained, ReadPieces, ReleaseState; worker/retained_state.h).
//
// Thread-safety: every method may be called from any thread; `mu_` guards
// its channels to peers; the job's state is the mesh's, under its `run_mu`.
#ifndef BATON_WORKER_STATE_SERVICE_H_
#define BATON_WORKER_STATE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "worker/mesh_host.h"
#include "worker/mesh_state.h"
#include "worker/retained_state.h"
#include "worker/worker_options.h"

namespace baton {

class StateService {
 public:
  // `host` and `options` must outlive it; `retained` is the host's.
  StateService(MeshHost* host, const WorkerOptions& options, std::shared_ptr<RetainedStates> retained)
      : host_(host), options_(options), retained_(std::move(retained)) {}

  grpc::Status SaveShards(const baton::v1::SaveShardsRequest& req, baton::v1::SaveShardsResponse* resp);
  grpc::Status FinishSave(const baton::v1::FinishSaveRequest& req, baton::v1::SaveShardsResponse* resp);
  grpc::Status LoadShards(const baton::v1::LoadShardsRequest& req, baton::v1::LoadShardsResponse* resp);
  grpc::Status GetRetained(const baton::v1::GetRetainedRequest& req, baton::v1::GetRetainedResponse* resp);
  grpc::Status ReadPieces(const baton::v1::ReadPiecesRequest& req, baton::v1::ReadPiecesResponse* resp);
  grpc::Status ReleaseState(const baton::v1::ReleaseStateRequest& req, baton::v1::ReleaseStateResponse* resp);

 private:
  // Waits (bounded) for the async save `pending` of `state` to end, without
  // holding its run lock, and clears it.
  static absl::StatusOr<baton::v1::SaveShardsResponse> AwaitPendingSave(MeshState& state,
                                                                        std::shared_ptr<PendingSave> pending,
                                                                        absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(state.run_mu);
  // Boxes of this worker's retained copy of `job_id` at `step`.
  absl::StatusOr<std::vector<std::string>> ReadRetained(
      const std::string& job_id, int step, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes);
  // Reads boxes of a holder's retained state: this worker's own, or a
  // peer's through ReadPieces.
  absl::StatusOr<std::vector<std::string>> FetchPieces(
      const baton::v1::PeerSource& peer, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes)
      ABSL_LOCKS_EXCLUDED(mu_);

  MeshHost* const host_;
  const WorkerOptions& options_;
  const std::shared_ptr<RetainedStates> retained_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> peer_channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_STATE_SERVICE_H_
