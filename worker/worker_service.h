// The worker daemon's gRPC service (baton.v1.Worker).
//
// A worker is in at most one mesh at a time. Configure(epoch) replaces the
// current mesh: it builds one communicator for the whole mesh ("world") and
// one per mesh axis, for the group along that axis that contains this rank.
// Communicators are shared_ptrs: Abort drops the service's references at
// once, and an operation still running on another RPC thread keeps its own
// until its collective returns (bounded by the collective timeout).
//
// Thread-safety: every method may be called concurrently from gRPC's
// threads; `mu_` guards the current mesh. Rendezvous runs without the lock, so
// a newer Configure or an Abort is never stuck behind a slow rendezvous.
#ifndef BATON_WORKER_WORKER_SERVICE_H_
#define BATON_WORKER_WORKER_SERVICE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/kv_store.h"
#include "common/security.h"
#include "proto/worker.grpc.pb.h"
#include "worker/comm/communicator.h"
#include "worker/executor.h"
#include "worker/retained_state.h"
#include "worker/step_channel.h"
#include "worker/step_thread.h"

namespace baton {

class WorkerMetrics;  // worker/worker_metrics.h

struct WorkerOptions {
  // Checkpoint paths in requests resolve under it (common/file_root.h).
  std::string file_root = "/nonexistent";
  // So do the token files a job's data names.
  std::string data_root = "/nonexistent";
  // Who may call the Worker service (the fleet's worker token).
  Authenticator auth;
  // Steps are counted here (nullptr: nowhere).
  WorkerMetrics* metrics = nullptr;
  // For tests that kill a worker mid-save: sleep this long before each
  // piece a save writes.
  int64_t testing_write_delay_ms = 0;
  // What this worker presents to its peers when it reads their retained
  // state, and its step channels' TLS: the fleet's worker token and TLS
  // (none: plaintext, no token).
  Credentials fleet_credentials;
  // gloo groups whose ranks share this host move all-reduce, all-gather
  // and reduce-scatter through shared memory (GlooOptions::shared_memory).
  bool gloo_shared_memory = true;
  // The GPU every NCCL group of this worker uses (NcclOptions::device_index):
  // the worker's, never a group rank's.
  int cuda_device = 0;
  // Offer each mesh's controller a step channel (worker/step_channel.h),
  // inside TLS when fleet_credentials have it.
  bool step_channel = true;
};

class WorkerService final : public baton::v1::Worker::Service {
 public:
  // `rendezvous` must outlive the service. `bind_host` is the address the
  // collectives' transport binds and advertises.
  WorkerService(baton::v1::WorkerInfo identity, Rendezvous* rendezvous, std::string bind_host,
                WorkerOptions options = {});

  // Replaces the identity GetInfo reports (the address is known only once
  // the server is bound).
  void set_identity(const baton::v1::WorkerInfo& identity);

  grpc::Status Configure(grpc::ServerContext* ctx, const baton::v1::ConfigureRequest* req,
                         baton::v1::ConfigureResponse* resp) override;
  grpc::Status RunCollectiveCheck(grpc::ServerContext* ctx,
                                  const baton::v1::CollectiveCheckRequest* req,
                                  baton::v1::CollectiveCheckResponse* resp) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const baton::v1::AbortRequest* req,
                     baton::v1::AbortResponse* resp) override;
  grpc::Status GetInfo(grpc::ServerContext* ctx, const baton::v1::GetInfoRequest* req,
                       baton::v1::GetInfoResponse* resp) override;
  grpc::Status LoadProgram(grpc::ServerContext* ctx, const baton::v1::LoadProgramRequest* req,
                           baton::v1::LoadProgramResponse* resp) override;
  grpc::Status RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest* req,
                       baton::v1::RunStepResponse* resp) override;
  // Checkpoints (the bytes: worker/checkpoint_io.h).
  grpc::Status SaveShards(grpc::ServerContext* ctx, const baton::v1::SaveShardsRequest* req,
                          baton::v1::SaveShardsResponse* resp) override;
  grpc::Status FinishSave(grpc::ServerContext* ctx, const baton::v1::FinishSaveRequest* req,
                          baton::v1::SaveShardsResponse* resp) override;
  grpc::Status LoadShards(grpc::ServerContext* ctx, const baton::v1::LoadShardsRequest* req,
                          baton::v1::LoadShardsResponse* resp) override;
  // A job's state kept past its mesh (worker/retained_state.h).
  grpc::Status GetRetained(grpc::ServerContext* ctx, const baton::v1::GetRetainedRequest* req,
                           baton::v1::GetRetainedResponse* resp) override;
  grpc::Status ReadPieces(grpc::ServerContext* ctx, const baton::v1::ReadPiecesRequest* req,
                          baton::v1::ReadPiecesResponse* resp) override;
  grpc::Status ReleaseState(grpc::ServerContext* ctx, const baton::v1::ReleaseStateRequest* req,
                            baton::v1::ReleaseStateResponse* resp) override;

 private:
  // An async save: pieces copied to host memory, written by its own thread.
  struct PendingSave {
    std::string job_id;
    int step = 0;
    absl::Notification done;
    absl::StatusOr<baton::v1::SaveShardsResponse> result;  // set before `done`
    std::thread writer;
    ~PendingSave() {
      if (writer.joinable()) writer.join();
    }
  };

  struct MeshState {
    baton::v1::Mesh mesh;
    int rank = 0;
    // "world" and every mesh axis name.
    std::map<std::string, std::shared_ptr<Communicator>> comms;
    std::map<std::string, std::vector<int>> group_ranks;
    // The loaded job, if any; `run_mu` lets one step run at a time.
    absl::Mutex run_mu;
    std::string job_id ABSL_GUARDED_BY(run_mu);
    std::unique_ptr<Executor> executor ABSL_GUARDED_BY(run_mu);
    // The step that failed on this rank (0: none did): the calls after it
    // fail at once, the mesh is aborted.
    int64_t failed_step ABSL_GUARDED_BY(run_mu) = 0;
    // Resident bytes when the job began loading (its peak growth is
    // measured from there).
    int64_t memory_baseline ABSL_GUARDED_BY(run_mu) = 0;
    // At most one async save in flight; a new save waits for it.
    std::shared_ptr<PendingSave> pending_save ABSL_GUARDED_BY(run_mu);
    // The figures of its last steps (RetainedStates::kRecentSteps), kept
    // with the job's state when the mesh goes.
    std::deque<baton::v1::StepMetrics> recent ABSL_GUARDED_BY(run_mu);
    // The controller's step channel, if one was offered; served by `steps`
    // (declared after it: the thread is joined before it goes).
    std::unique_ptr<StepChannelServer> channel;
    // Where its steps run, whichever RPC thread or channel asked (joined
    // when the mesh goes: never the last reference from a step). Nobody
    // holds run_mu while waiting for it.
    StepThread steps;
  };

  // The checks of a RunStep that need no mesh.
  static grpc::Status ValidateStepRequest(const baton::v1::RunStepRequest& req);
  // On the mesh's step thread: whether `req` is the loaded job's next call,
  // then its steps, each one's metrics into `resp`. A failed step's status
  // carries `resp` (rank, failed step, the steps before it) as its details.
  grpc::Status StepOnThread(MeshState& mesh, const baton::v1::RunStepRequest& req,
                            const std::function<bool()>& cancelled, baton::v1::RunStepResponse* resp)
      ABSL_LOCKS_EXCLUDED(mesh.run_mu);
  // Runs `req`'s steps in order on this thread, each counted in this
  // worker's metrics as it ends; the first that fails (or a call cancelled
  // between steps) ends them: its status and step, else OK.
  std::pair<absl::Status, int64_t> RunSteps(MeshState& mesh, const std::function<bool()>& cancelled,
                                            const baton::v1::RunStepRequest& req, baton::v1::RunStepResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu);
  // A call that came over `mesh`'s step channel.
  void AnswerChannelStep(MeshState& mesh, const baton::v1::RunStepRequest& req,
                         const std::function<bool()>& hung_up, baton::v1::StepChannelReply* reply);
  // A call for `step` waits (run_mu released meanwhile) until the step
  // before it has run here, one failed, or the job left the mesh; the most
  // it waits, and how often it looks whether its call was cancelled.
  static constexpr absl::Duration kMaxTurnWait = absl::Hours(1);
  static constexpr absl::Duration kTurnPoll = absl::Milliseconds(50);
  static grpc::Status AwaitTurn(MeshState& mesh, const grpc::ServerContext& ctx, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu);
  // NOT_FOUND unless job `job_id` is the one loaded on `mesh`.
  grpc::Status RequireJob(const MeshState& mesh, const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu);
  // Waits (bounded) for the async save `pending` of `state` to end, without
  // holding its run lock, and clears it.
  static absl::StatusOr<baton::v1::SaveShardsResponse> AwaitPendingSave(MeshState& state,
                                                                        std::shared_ptr<PendingSave> pending,
                                                                        absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(state.run_mu);

  // Aborts the communicators of `state` with `reason` and drops it; the
  // job loaded on it is kept in `retained_` unless `drop_job`.
  void ReleaseInBackground(std::shared_ptr<MeshState> state, const std::string& reason, bool drop_job = false);
  // Drops this reference to `state` on another thread (it may be the last).
  static void DropInBackground(std::shared_ptr<MeshState> state);
  // The current mesh if it has `epoch`, else FAILED_PRECONDITION.
  absl::StatusOr<std::shared_ptr<MeshState>> MeshOfEpoch(int64_t epoch);

  std::string name() ABSL_LOCKS_EXCLUDED(mu_);
  // The fleet's worker token, and the call meant for this worker.
  grpc::Status Admit(const grpc::ServerContextBase* ctx) ABSL_LOCKS_EXCLUDED(mu_);
  // Everything about a Configure request that can be checked without
  // touching the current mesh.
  absl::Status ValidateConfigure(const baton::v1::ConfigureRequest& req);
  absl::StatusOr<std::shared_ptr<MeshState>> BuildMesh(const baton::v1::ConfigureRequest& req);
  // Boxes of this worker's retained copy of `job_id` at `step`.
  absl::StatusOr<std::vector<std::string>> ReadRetained(
      const std::string& job_id, int step, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes);
  // Reads boxes of a holder's retained state: this worker's own, or a
  // peer's through ReadPieces.
  absl::StatusOr<std::vector<std::string>> FetchPieces(
      const baton::v1::PeerSource& peer, const google::protobuf::RepeatedPtrField<baton::v1::PieceBox>& boxes);

  Rendezvous* const rendezvous_;
  const std::string bind_host_;
  const WorkerOptions options_;

  absl::Mutex mu_;
  baton::v1::WorkerInfo identity_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<MeshState> current_ ABSL_GUARDED_BY(mu_);
  // Bumped by every Configure and by an Abort of the epoch being
  // configured: a rendezvous that finishes after its generation changed is
  // discarded. The latest Configure wins, whatever its epoch, so a restarted
  // controller (whose epochs start again at 1) is obeyed.
  int64_t configure_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t configuring_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // 0 = none in progress
  // Shared with the threads that drop meshes (they may outlive a call).
  const std::shared_ptr<RetainedStates> retained_ = std::make_shared<RetainedStates>();
  std::map<std::string, std::shared_ptr<grpc::Channel>> peer_channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_SERVICE_H_
