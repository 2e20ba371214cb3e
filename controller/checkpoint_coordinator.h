// CheckpointCoordinator: one job's sharded checkpoints - its saves (sync, or
// async with at most one in flight), their publication, keep_last, the
// clean-up of a save that failed, and loading a checkpoint into a job just
// placed.
//
// A save: the planner names the pieces each rank writes (strategies/
// checkpoint_plan.h); every writing rank writes one data file
// (Worker.SaveShards); once all have, the coordinator writes the metadata
// last (checkpoint/files.h: temporary name, fsync, rename). A save that fails
// leaves nothing behind: the workers remove a file they could not finish,
// and the coordinator removes every data file of that save (a rank killed
// midway cannot), so a full disk does not stay full. The previous checkpoint
// of that step, if any, stays the one that exists.
//
// Thread-safety: Save and Load run on the job's runner (or an RPC thread
// holding the job's work lock), one at a time; the async publisher runs on
// its own thread and only touches the job and the events.
#ifndef BATON_CONTROLLER_CHECKPOINT_COORDINATOR_H_
#define BATON_CONTROLLER_CHECKPOINT_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "controller/job.h"
#include "controller/mesh_manager.h"
#include "proto/checkpoint.pb.h"
#include "proto/worker.pb.h"

namespace baton {

// What a job loads when it is placed: the checkpoint its resume_from names
// (parameters, AdamW moments, step, data position) or the safetensors file
// its init_from names (parameters), resharded onto its plan.
struct RestorePlan {
  baton::v1::CheckpointInfo info;  // path and step; an empty path: nothing to load
  baton::v1::CheckpointMetadata metadata;
  std::string dir;  // where its files are
  bool optimizer = false;
  // The data stream the job reads: the saved run's seed for resume_from.
  uint64_t data_seed = 0;
  std::vector<std::vector<baton::v1::ShardRead>> reads;  // by rank
  // The newest step the job logged before this restore (a requeued job's:
  // what the controller that died logged; a recovering job's: its step when
  // it failed). What it restores from below that is redone
  // (CheckpointInfo.steps_redone), whether or not its workers' state was
  // found.
  int logged_step = 0;
};

// Reads what `job` restores (nothing when it names neither), checks it was
// saved from the job's model and fits `programs`, and plans every rank's
// reads. `resume_from` overrides the spec's (a requeued job resumes from its
// own last checkpoint). Nothing touches a worker.
absl::StatusOr<RestorePlan> PlanRestore(const std::string& file_root, const baton::v1::JobSpec& job,
                                        const std::vector<baton::v1::Program>& programs,
                                        const std::string& resume_from);
// A fingerprint of a job's spec as submitted, less its mesh's sizes and the
// workers it names, which a rescale changes (16 hex digits of the SHA-256 of
// its deterministic encoding): what, with the job's id, marks the
// checkpoints it saves as its own (CheckpointMetadata.job_fingerprint).
std::string JobFingerprint(const baton::v1::JobSpec& spec);
// Whether `md` was saved by the job `job_id` whose spec has `fingerprint`.
bool SavedBy(const baton::v1::CheckpointMetadata& md, const std::string& job_id, const std::string& fingerprint);

// checkpoint.dir lies under the root and files can be created there.
absl::Status CheckCheckpointDir(const std::string& file_root, const baton::v1::JobSpec& job);

struct CheckpointOptions {
  // Checkpoint directories resolve under it (common/file_root.h).
  std::string file_root = "/nonexistent";
  // Checksum granularity of saved chunks: a resharding load reads whole blocks.
  int64_t block_bytes = 1 << 20;
  absl::Duration rpc_slack = absl::Seconds(5);
};

class CheckpointCoordinator {
 public:
  static constexpr absl::Duration kSaveDeadline = absl::Minutes(10);
  static constexpr absl::Duration kLoadDeadline = absl::Minutes(10);

  // `published`: told the path of each save it publishes (nullptr: none).
  CheckpointCoordinator(Job* job, MeshManager* meshes, EventLog* events, CheckpointOptions options,
                        std::function<void(const std::string&)> published = nullptr);
  ~CheckpointCoordinator();  // waits for the save in flight

  // Loads `plan` into the Programs just loaded on `mesh`; the job's step is
  // the checkpoint's afterwards.
  // `not_live`: why it does not restore from live workers (said with it).
  absl::StatusOr<baton::v1::CheckpointInfo> Load(const RestorePlan& plan, const baton::v1::Mesh& mesh,
                                                 const std::string& not_live = "");
  // Saves the job's state at its completed step under DIR/step-N. Sync:
  // returns once the metadata is published. Async: once every worker copied
  // its pieces; a thread publishes it later. A save still in flight ends
  // first. Periodic saves count towards checkpoint.max_failures.
  absl::StatusOr<baton::v1::CheckpointInfo> Save(const baton::v1::Mesh& mesh, const std::string& dir, bool async,
                                                 bool periodic);
  // Waits up to `timeout` for the async save in flight (if any) to be
  // published or fail; DEADLINE_EXCEEDED while it is still in flight.
  absl::Status AwaitInFlight(absl::Duration timeout);

 private:
  struct InFlight {
    int step = 0;
    absl::Notification done;
    std::thread thread;
  };
  // Builds and publishes the metadata of a save whose data files are
  // written; applies keep_last.
  absl::StatusOr<baton::v1::CheckpointInfo> Publish(
      const std::string& step_dir, const std::string& root_dir,
      const std::vector<CallResult<baton::v1::SaveShardsResponse>>& written, int step, absl::Time started,
      bool async, double copy_seconds);
  // Hands the workers' I/O spans of a save of `step` (answers[i] from rank
  // ranks[i]) to the job's trace (controller/job_trace.h).
  void TraceIo(const baton::v1::Mesh& mesh, int step, const std::vector<int>& ranks,
               const std::vector<CallResult<baton::v1::SaveShardsResponse>>& answers);
  // Records the outcome of a save in the job's status, log and the events.
  void Record(const absl::StatusOr<baton::v1::CheckpointInfo>& outcome, int step, bool periodic);
  // Removes the data files `files` of a failed save in `step_dir`, and the
  // directory when nothing else is in it.
  static void RemoveFailedSave(const std::string& step_dir, const std::vector<std::string>& files);
  void JoinInFlight() ABSL_LOCKS_EXCLUDED(mu_);

  Job* const job_;
  MeshManager* const meshes_;
  EventLog* const events_;
  const CheckpointOptions options_;
  const std::function<void(const std::string&)> published_;
  absl::Mutex mu_;
  std::shared_ptr<InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_CHECKPOINT_COORDINATOR_H_
