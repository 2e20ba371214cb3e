// MeshHost: the worker's mesh and its lifecycle. A worker is in at most one
// mesh at a time. Configure(epoch) replaces the current mesh: it builds one
// communicator for the whole mesh ("world") and one per mesh axis, for the
// group along that axis that contains this rank. Abort drops it; a dropped
// mesh's job is kept in the retained states (worker/retained_state.h) once
// its last step has returned, unless the controller drops that too. Also the
// worker's identity (GetInfo) and the collective self-check.
//
// Communicators are shared_ptrs: Abort drops the host's references at once,
// and an operation still running on another thread keeps its own until its
// collective returns (bounded by the collective timeout).
//
// Thread-safety: every method may be called from any thread; `mu_` guards
// the identity and the current mesh. Rendezvous runs without the lock, so a
// newer Configure or an Abort is never stuck behind a slow rendezvous.
#ifndef BATON_WORKER_MESH_HOST_H_
#define BATON_WORKER_MESH_HOST_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/kv_store.h"
#include "proto/worker.pb.h"
#include "worker/mesh_state.h"
#include "worker/retained_state.h"
#include "worker/worker_options.h"

namespace baton {

class MeshHost {
 public:
  // A call that came over a mesh's step channel (the step execution's).
  using ChannelStep = std::function<void(MeshState& mesh, const baton::v1::RunStepRequest& req,
                                         const std::function<bool()>& hung_up, baton::v1::StepChannelReply* reply)>;

  // `rendezvous` must outlive the host; `bind_host` is the address the
  // collectives' transport binds and advertises; a dropped mesh's job goes
  // to `retained`.
  MeshHost(baton::v1::WorkerInfo identity, Rendezvous* rendezvous, std::string bind_host, const WorkerOptions& options,
           std::shared_ptr<RetainedStates> retained);

  // Before the first Configure: who answers the meshes' step channels.
  void set_channel_steps(ChannelStep answer) { channel_steps_ = std::move(answer); }
  // Replaces the identity GetInfo reports (the address is known only once
  // the server is bound).
  void set_identity(const baton::v1::WorkerInfo& identity) ABSL_LOCKS_EXCLUDED(mu_);
  std::string name() ABSL_LOCKS_EXCLUDED(mu_);
  // The current mesh if it has `epoch`, else FAILED_PRECONDITION.
  absl::StatusOr<std::shared_ptr<MeshState>> MeshOfEpoch(int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status Configure(const baton::v1::ConfigureRequest& req, baton::v1::ConfigureResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status RunCollectiveCheck(const grpc::ServerContext& ctx, const baton::v1::CollectiveCheckRequest& req,
                                  baton::v1::CollectiveCheckResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Abort(const baton::v1::AbortRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status GetInfo(baton::v1::GetInfoResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the current mesh, if any, with `reason`; its job's state is kept.
  void DropCurrent(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops this reference to `state` on another thread (it may be the last).
  static void DropInBackground(std::shared_ptr<MeshState> state);

 private:
  // Aborts the communicators of `state` with `reason` and drops it; the
  // job loaded on it is kept in `retained_` unless `drop_job`.
  void ReleaseInBackground(std::shared_ptr<MeshState> state, const std::string& reason, bool drop_job = false);
  // Everything about a Configure request that can be checked without
  // touching the current mesh.
  absl::Status ValidateConfigure(const baton::v1::ConfigureRequest& req);
  absl::StatusOr<std::shared_ptr<MeshState>> BuildMesh(const baton::v1::ConfigureRequest& req);

  Rendezvous* const rendezvous_;
  const std::string bind_host_;
  const WorkerOptions& options_;
  // Shared with the threads that drop meshes (they may outlive a call).
  const std::shared_ptr<RetainedStates> retained_;
  ChannelStep channel_steps_;

  absl::Mutex mu_;
  baton::v1::WorkerInfo identity_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<MeshState> current_ ABSL_GUARDED_BY(mu_);
  // Bumped by every Configure and by an Abort of the epoch being
  // configured: a rendezvous that finishes after its generation changed is
  // discarded. The latest Configure wins, whatever its epoch, so a restarted
  // controller (whose epochs start again at 1) is obeyed.
  int64_t configure_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t configuring_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // 0 = none in progress
};

}  // namespace baton

#endif  // BATON_WORKER_MESH_HOST_H_
