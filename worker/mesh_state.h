// The state of the one mesh a worker is in (its communicators, the job
// loaded on it, its step thread), owned by the MeshHost (worker/mesh_host.h)
// and shared with the step execution and the state service, which take
// `run_mu` to touch the job.
#ifndef BATON_WORKER_MESH_STATE_H_
#define BATON_WORKER_MESH_STATE_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/worker.pb.h"
#include "worker/comm/communicator.h"
#include "worker/executor.h"
#include "worker/step_channel.h"
#include "worker/step_thread.h"

namespace baton {

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

// NOT_FOUND unless job `job_id` is the one loaded on `mesh` (of `worker`).
grpc::Status RequireJob(const MeshState& mesh, const std::string& job_id, const std::string& worker)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mesh.run_mu);

}  // namespace baton

#endif  // BATON_WORKER_MESH_STATE_H_
