// baton.v1.Controller: what clients call. Forms meshes over the registered
// workers, drives collective checks on all of them at once, reports status
// and streams events. A monitor thread sweeps heartbeats: when a worker of
// the current mesh dies, the mesh is aborted on every worker and its
// rendezvous keys are poisoned, so nothing waits for the dead rank.
//
// Threads: gRPC's pool runs the RPCs; `op_mu_` lets one fleet operation
// (forming a mesh, a check) run at a time; `mu_` guards the current mesh and
// is never held across an RPC; the monitor thread only takes `mu_`.
#ifndef BATON_CONTROLLER_CONTROLLER_SERVICE_H_
#define BATON_CONTROLLER_CONTROLLER_SERVICE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/kv_store.h"
#include "common/security.h"
#include "controller/dispatcher.h"
#include "controller/event_log.h"
#include "controller/worker_registry.h"
#include "mesh/device_mesh.h"
#include "proto/checkpoint.pb.h"
#include "strategies/plan_theory.h"
#include "proto/controller.grpc.pb.h"

namespace baton {

class ControllerMetrics;  // controller/controller_metrics.h

struct ControllerOptions {
  // How long workers may take to connect their communicators.
  absl::Duration rendezvous_timeout = absl::Seconds(10);
  // How often heartbeats are checked; detection time is at most
  // heartbeat_timeout + sweep_interval.
  absl::Duration sweep_interval = absl::Milliseconds(200);
  // Extra time every worker RPC gets beyond the work it was asked to do.
  absl::Duration rpc_slack = absl::Seconds(5);
  // Checkpoint directories resolve under it (common/file_root.h).
  std::string file_root = "/nonexistent";
  // Checksum granularity of saved chunks: a resharding load reads whole blocks.
  int64_t checkpoint_block_bytes = 1 << 20;
  // Who may call the Controller service (the client token).
  Authenticator auth;
  // The backend of meshes whose request leaves it unspecified (the GPU
  // deployment sets NCCL).
  baton::v1::CommBackend default_backend = baton::v1::GLOO;
  // Steps, tokens and comm bytes go here (nullptr: none).
  ControllerMetrics* metrics = nullptr;
  // What the controller presents to workers (the worker token, TLS).
  Credentials worker_credentials;
};

// "worker NAME (rank R, ADDRESS)": how errors name a rank of `mesh`.
std::string WorkerLabel(const baton::v1::Mesh& mesh, int rank);

// Watch is served by gRPC's callback API (a reactor per stream, no thread
// held while it waits for events); every other method is synchronous.
class ControllerService final : public baton::v1::Controller::WithCallbackMethod_Watch<baton::v1::Controller::Service> {
 public:
  ControllerService(WorkerRegistry* registry, KeyValueStore* kv, EventLog* events,
                    ControllerOptions options);
  ~ControllerService() override;

  // Starts / stops the heartbeat monitor.
  void Start();
  void Stop();

  grpc::Status Status(grpc::ServerContext*, const baton::v1::StatusRequest*,
                      baton::v1::StatusResponse* resp) override;
  grpc::Status CreateMesh(grpc::ServerContext*, const baton::v1::CreateMeshRequest* req,
                          baton::v1::CreateMeshResponse* resp) override;
  grpc::Status CheckCollectives(grpc::ServerContext*,
                                const baton::v1::CheckCollectivesRequest* req,
                                baton::v1::CheckCollectivesResponse* resp) override;
  grpc::ServerWriteReactor<baton::v1::Event>* Watch(grpc::CallbackServerContext* ctx,
                                                     const baton::v1::WatchRequest* req) override;
  // What Status returns; with the job's step history and recent events for
  // the status page when `with_history`.
  baton::v1::StatusResponse Snapshot(bool with_history) const;
  // Where /metrics and the status page are served (for Status).
  void set_http_address(const std::string& address) {
    absl::MutexLock lock(&mu_);
    http_address_ = address;
  }
  // Jobs (controller_jobs.cc).
  grpc::Status CreateJob(grpc::ServerContext*, const baton::v1::CreateJobRequest* req,
                         baton::v1::CreateJobResponse* resp) override;
  grpc::Status Step(grpc::ServerContext*, const baton::v1::StepRequest* req,
                    baton::v1::StepResponse* resp) override;
  grpc::Status StopJob(grpc::ServerContext*, const baton::v1::StopJobRequest* req,
                       baton::v1::StopJobResponse* resp) override;
  // Checkpoints (controller_checkpoints.cc).
  grpc::Status SaveCheckpoint(grpc::ServerContext*, const baton::v1::SaveCheckpointRequest* req,
                              baton::v1::SaveCheckpointResponse* resp) override;
  grpc::Status WaitCheckpoint(grpc::ServerContext*, const baton::v1::WaitCheckpointRequest* req,
                              baton::v1::SaveCheckpointResponse* resp) override;

 private:
  // Returns the current mesh if it matches and is intact, else forms a new
  // one (new epoch) and configures every worker of it.
  absl::StatusOr<baton::v1::Mesh> EnsureMesh(const baton::v1::MeshSpec& spec,
                                             baton::v1::CommBackend backend)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Tears the mesh down everywhere: poisons its rendezvous keys, tells every
  // live worker of it to abort, forgets it.
  void AbortMesh(const baton::v1::Mesh& mesh, const std::string& reason);
  // "" while every worker of the mesh is alive; else which one is not.
  std::string DeadWorkerIn(const baton::v1::Mesh& mesh) const;
  // The ranks of `mesh` whose worker is DEAD (or forgotten).
  std::vector<size_t> DeadRanksIn(const baton::v1::Mesh& mesh) const;
  // One sentence naming the worker (and rank) that most likely caused the
  // failures in `statuses` (indexed by mesh rank).
  // Probes every worker of the mesh (GetInfo, kProbeDeadline) to tell a
  // crashed one from survivors that merely saw a collective fail.
  std::string ExplainFailure(const baton::v1::Mesh& mesh, const std::vector<grpc::Status>& statuses);
  static constexpr absl::Duration kProbeDeadline = absl::Seconds(2);
  static constexpr absl::Duration kTrimInterval = absl::Seconds(1);
  void MonitorLoop();
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
  // Aborts `mesh` for `abort_reason`, or else for what `statuses` (by rank)
  // explain; returns the sentence.
  std::string AbortWith(const baton::v1::Mesh& mesh, const std::vector<grpc::Status>& statuses,
                        const std::string& abort_reason) {
    const std::string why = abort_reason.empty() ? ExplainFailure(mesh, statuses) : abort_reason;
    AbortMesh(mesh, why);
    return why;
  }
  // Marks the current job FAILED (if it runs on `mesh`) with `reason`.
  void FailJob(const baton::v1::Mesh& mesh, const std::string& reason);
  int64_t LiveWorkers() const;
  // Whether `job` fits every live worker: threads_per_rank within its cores,
  // the plan's per-rank bytes within its reported memory.
  absl::Status CheckFits(const baton::v1::JobSpec& job, const PlanTheory& theory) const;
  // The id of the job that holds the fleet (created or running), or "".
  std::string ActiveJob() const;

  WorkerRegistry* const registry_;
  KeyValueStore* const kv_;
  EventLog* const events_;
  const ControllerOptions options_;
  Dispatcher dispatcher_;

  absl::Mutex op_mu_;
  mutable absl::Mutex mu_;
  baton::v1::Mesh current_ ABSL_GUARDED_BY(mu_);  // epoch 0 = none
  std::vector<std::string> current_incarnations_ ABSL_GUARDED_BY(mu_);
  baton::v1::CommBackend current_backend_ ABSL_GUARDED_BY(mu_) = baton::v1::GLOO;
  int64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;

  // The current (or last) job; at most one runs at a time.
  struct JobRecord {
    baton::v1::JobStatus status;
    baton::v1::JobSpec spec;
    baton::v1::Mesh mesh;
    std::shared_ptr<const std::vector<baton::v1::Program>> programs;  // by rank
  };

  // What a resume_from / init_from of a job to be created loads: planned
  // before any worker is touched.
  struct Restore {
    baton::v1::CheckpointInfo info;  // path and step
    baton::v1::CheckpointMetadata metadata;
    std::string dir;  // where its files are
    bool optimizer = false;
  };
  // Reads the checkpoint (or safetensors file) `job` names, checks it was
  // saved from the job's model and takes its seed (the data position) into
  // `job`. nullopt-like: an empty path when the job restores nothing.
  absl::StatusOr<Restore> ReadRestore(baton::v1::JobSpec& job);
  // Loads `restore` by `plan` (PlanLoad's reads, by rank) into the Programs
  // just loaded on `mesh`.
  absl::StatusOr<baton::v1::CheckpointInfo> LoadRestore(const Restore& restore,
                                                        const std::vector<std::vector<baton::v1::ShardRead>>& plan,
                                                        const baton::v1::Mesh& mesh, const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Saves `job`'s state at its completed step under DIR/step-N. Sync:
  // returns once the metadata is published. Async: once every worker copied
  // its pieces; a thread publishes it later (save_in_flight_).
  absl::StatusOr<baton::v1::CheckpointInfo> SaveJob(const JobRecord& job, const std::string& dir, bool async)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Builds and publishes the metadata of a save whose data files are
  // written; applies keep_last; records it in the job's status.
  absl::StatusOr<baton::v1::CheckpointInfo> PublishSave(
      const JobRecord& job, const std::string& step_dir, const std::string& root_dir,
      const std::vector<CallResult<baton::v1::SaveShardsResponse>>& written, absl::Time started, bool async,
      double copy_seconds);
  // Waits for the async save in flight, if any, to be published or fail.
  void FinishInFlightSave();
  struct SaveInFlight {
    std::string job_id;
    int step = 0;
    absl::Notification done;
    std::thread thread;
  };
  std::shared_ptr<SaveInFlight> save_in_flight_ ABSL_GUARDED_BY(mu_);
  JobRecord job_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;

  absl::Notification stop_;
  std::thread monitor_;
  // Streams cost no thread, only memory: a bounded number, each starting
  // with at most kWatchHistory past events.
  static constexpr int kMaxWatchStreams = 256;
  static constexpr size_t kWatchHistory = 1000;
  std::atomic<int> watch_streams_{0};
  // For the status page: the current job's steps (at most kHistorySteps).
  static constexpr size_t kHistorySteps = 1000;
  static constexpr size_t kPageEvents = 50;
  std::deque<baton::v1::StepMetrics> history_ ABSL_GUARDED_BY(mu_);
  std::string http_address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_CONTROLLER_SERVICE_H_
