// MeshManager: which worker serves which mesh. It hands out disjoint sets of
// free workers to owners (a job, a collective check), forms meshes on them -
// a new epoch each, unique across controller restarts - and aborts them.
// Meshes of different owners never share a worker, and a worker serves one
// mesh at a time, so one owner's abort leaves every other mesh untouched.
//
// A mesh's life:
//
//   Reserve(owner) --Form--> FORMED (owned) --Release--> aborted; workers free
//                              |      |
//                              |      +--Release(keep_formed)--> IDLE (no owner;
//                              |             workers free; aborted once one of
//                              |             them is taken for another mesh)
//                              +--a worker DEAD / Abort--> aborted; the owner is
//                                 told (on_mesh_lost) and keeps its workers
//                                 until it releases them
//
// Thread-safety: every method may be called from any thread. `mu_` guards
// the tables and is never held across an RPC or a callback.
#ifndef BATON_CONTROLLER_MESH_MANAGER_H_
#define BATON_CONTROLLER_MESH_MANAGER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/kv_store.h"
#include "common/security.h"
#include "controller/dispatcher.h"
#include "controller/event_log.h"
#include "controller/step_channels.h"
#include "controller/worker_registry.h"
#include "proto/job.pb.h"
#include "proto/mesh.pb.h"

namespace baton {

// "worker NAME (rank R, ADDRESS)": how errors name a rank of `mesh`.
std::string WorkerLabel(const baton::v1::Mesh& mesh, int rank);

struct MeshOptions {
  // How long workers may take to connect their communicators.
  absl::Duration rendezvous_timeout = absl::Seconds(10);
  // Extra time every worker RPC gets beyond the work it was asked to do.
  absl::Duration rpc_slack = absl::Seconds(5);
  // The backend of meshes whose request leaves it unspecified.
  baton::v1::CommBackend default_backend = baton::v1::GLOO;
  // A new epoch for every mesh (the job store persists the counter, so
  // epochs stay unique across controller restarts); default: counts from 1.
  std::function<int64_t()> next_epoch;
  // The fleet's TLS for the meshes' step channels (controller/step_channels.h):
  // with a CA, certificate and key they are TLS, as the fleet's gRPC calls.
  Credentials step_channel_tls;
};

// The kind of device a worker computes on (its compute_device before the
// colon; a worker that does not say: CPU), and the kind a job asks for.
baton::v1::DeviceKind WorkerDeviceKind(const baton::v1::WorkerInfo& worker);
baton::v1::DeviceKind JobDeviceKind(const baton::v1::JobSpec& job);

class MeshManager {
 public:
  // Called when a mesh that has an owner is aborted by something other than
  // the owner's own Release (a worker died, another caller aborted it).
  using MeshLost = std::function<void(const std::string& owner, const baton::v1::Mesh& mesh, const std::string& why)>;

  MeshManager(WorkerRegistry* registry, KeyValueStore* kv, EventLog* events, Dispatcher* dispatcher,
              MeshOptions options);

  void set_on_mesh_lost(MeshLost on_lost) ABSL_LOCKS_EXCLUDED(mu_);

  // Live workers no owner holds, in fleet order.
  std::vector<baton::v1::WorkerInfo> FreeWorkers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every worker, with `held_by` filled in.
  std::vector<baton::v1::WorkerInfo> Workers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `need` free workers for `owner`: the ones `named` (in that order)
  // when it names any, else the first free ones not in `spare` (kept for a
  // job ahead of it in the queue). RESOURCE_EXHAUSTED naming the needed and
  // free counts (or the named worker that is not free).
  // With `kind` (a job's device), only workers that compute on that kind of
  // device are taken; a named one of another kind is refused.
  absl::StatusOr<std::vector<baton::v1::WorkerInfo>> Reserve(
      const std::string& owner, int need, const std::vector<std::string>& named,
      const std::set<std::string>& spare = {},
      std::optional<baton::v1::DeviceKind> kind = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);
  // Forms a mesh of `axes` on the workers `owner` reserved (rank r = the
  // r-th of them) and configures every one of them (their rendezvous).
  // An idle mesh holding any of them is aborted first.
  absl::StatusOr<baton::v1::Mesh> Form(const std::string& owner, const std::vector<baton::v1::MeshAxis>& axes,
                                       baton::v1::CommBackend backend) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back what `owner` holds: its mesh is aborted on every live worker
  // (or, with `keep_formed`, stays formed and idle) and its workers are free.
  // Its workers keep the state of the job loaded on it (a restart or a
  // rescale restores from them: controller/live_restore.h) ...
  void Release(const std::string& owner, const std::string& reason, bool keep_formed = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ... but not when the job ended.
  void ReleaseEnded(const std::string& owner, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts `mesh` everywhere: poisons its rendezvous keys, tells every live
  // worker of it to drop it. Its owner keeps its workers and is told.
  void Abort(const baton::v1::Mesh& mesh, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // After a failure on `mesh`: its workers whose address refuses
  // connections (their process is gone) are DEAD now - in the registry, and
  // for every mesh they were in (OnWorkersDead) - not a heartbeat timeout
  // later. Returns their names. Its ranks are probed in parallel, at most
  // kGoneProbes at once, each for up to kGoneProbeTimeout.
  static constexpr int kGoneProbes = 64;
  static constexpr absl::Duration kGoneProbeTimeout = absl::Milliseconds(300);
  std::vector<std::string> DeclareGone(const baton::v1::Mesh& mesh);
  // Newly DEAD workers (from the monitor): every mesh holding one is aborted.
  void OnWorkersDead(const std::vector<std::string>& names) ABSL_LOCKS_EXCLUDED(mu_);

  // Every formed mesh, by epoch.
  std::vector<baton::v1::Mesh> Meshes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `mesh` is still formed (not aborted, not replaced).
  bool Intact(const baton::v1::Mesh& mesh) const ABSL_LOCKS_EXCLUDED(mu_);
  // The step channels to `mesh`'s ranks (controller/step_channels.h), opened
  // when it formed; nullptr when it has none, they broke, or it is gone:
  // its RunStep calls go over gRPC.
  std::shared_ptr<StepChannels> StepChannelsOf(const baton::v1::Mesh& mesh) const ABSL_LOCKS_EXCLUDED(mu_);

  // "" while every worker of the mesh is alive; else which one is not.
  std::string DeadWorkerIn(const baton::v1::Mesh& mesh) const;
  // The ranks of `mesh` whose worker is DEAD (or forgotten).
  std::vector<size_t> DeadRanksIn(const baton::v1::Mesh& mesh) const;
  // One sentence naming the worker (and rank) that most likely caused the
  // failures in `statuses` (indexed by mesh rank). Probes every worker of
  // the mesh (GetInfo, kProbeDeadline) to tell a crashed one from survivors
  // that merely saw a collective fail.
  std::string ExplainFailure(const baton::v1::Mesh& mesh, const std::vector<grpc::Status>& statuses);
  // Aborts `mesh` for `abort_reason`, or else for what `statuses` (by rank)
  // explain; returns the sentence.
  std::string AbortWith(const baton::v1::Mesh& mesh, const std::vector<grpc::Status>& statuses,
                        const std::string& abort_reason);
  // "" when every call of a fan-out over `mesh` succeeded (and `valid`, if
  // given, accepts its response). Otherwise aborts the mesh everywhere and
  // returns a sentence naming the worker most likely at fault.
  template <typename Resp>
  std::string AbortOnFailure(const baton::v1::Mesh& mesh, const std::vector<CallResult<Resp>>& results,
                             const std::string& abort_reason,
                             const std::function<bool(const Resp&)>& valid = nullptr) {
    std::vector<grpc::Status> statuses;
    bool ok = abort_reason.empty();
    for (const auto& r : results) {
      statuses.push_back(r.status);
      ok = ok && r.status.ok() && (!valid || valid(r.response));
    }
    if (ok) return "";
    return AbortWith(mesh, statuses, abort_reason);
  }
  // Sets the registry state of the live workers of `mesh`.
  void SetState(const baton::v1::Mesh& mesh, baton::v1::WorkerState state);

  Dispatcher* dispatcher() const { return dispatcher_; }
  const MeshOptions& options() const { return options_; }
  // Its ranks' workers, in rank order, to call.
  static std::vector<WorkerTarget> Targets(const baton::v1::Mesh& mesh);

  static constexpr absl::Duration kProbeDeadline = absl::Seconds(2);
  static constexpr absl::Duration kAbortDeadline = absl::Seconds(2);

 private:
  struct Formed {
    baton::v1::Mesh mesh;  // job_id: the owner ("" when idle)
    std::vector<std::string> incarnations;  // by rank
    std::shared_ptr<StepChannels> channels;  // none: RunStep over gRPC
  };
  // Forgets mesh `epoch` (if formed) and returns it; epoch 0 when none.
  baton::v1::Mesh Unform(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The abort itself: keys poisoned, event, live workers told. No lock.
  void AbortFormed(const baton::v1::Mesh& mesh, const std::string& reason, bool drop_job_state = false);
  void Free(const std::string& owner, const std::string& reason, bool keep_formed, bool drop_job_state)
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t NewEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Connects `mesh`'s step channels when every rank's Configure answer
  // offers one; whether it did.
  bool OpenStepChannels(const baton::v1::Mesh& mesh,
                        const std::vector<CallResult<baton::v1::ConfigureResponse>>& configured)
      ABSL_LOCKS_EXCLUDED(mu_);

  WorkerRegistry* const registry_;
  KeyValueStore* const kv_;
  EventLog* const events_;
  Dispatcher* const dispatcher_;
  const MeshOptions options_;

  mutable absl::Mutex mu_;
  MeshLost on_lost_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> held_by_ ABSL_GUARDED_BY(mu_);  // worker -> owner
  std::map<std::string, std::vector<std::string>> reserved_ ABSL_GUARDED_BY(mu_);  // owner -> workers
  std::map<int64_t, Formed> formed_ ABSL_GUARDED_BY(mu_);  // by epoch
  int64_t epoch_counter_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_MESH_MANAGER_H_
