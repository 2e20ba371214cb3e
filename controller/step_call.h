// StepCall: one call of a job's steps - first .. first + k - 1, in one
// RunStep on every rank of its mesh - put on the wire when it is made and
// waited for by Finish. The runner makes the next call while one runs, so
// each worker holds the next call when it ends the one before (the worker
// waits for its turn, worker/worker_service.h): the round trip between calls
// is hidden, not paid per call.
//
// When a rank fails, the mesh is aborted on every worker at once (a rank
// blocked on a dead stage's neighbour returns instead of waiting for its
// timeout), every rank's own outcome is collected, and the steps that every
// rank completed before the failure are recorded. A StepCall destroyed
// without Finish (the call before it failed) is cancelled.
//
// Not thread-safe: the job's runner makes, finishes and destroys it under
// the job's work lock.
#ifndef BATON_CONTROLLER_STEP_CALL_H_
#define BATON_CONTROLLER_STEP_CALL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/dispatcher.h"
#include "controller/job.h"
#include "controller/mesh_manager.h"
#include "controller/step_channels.h"

namespace baton {

class ControllerMetrics;  // controller/controller_metrics.h

class StepCall {
 public:
  // A step is many collectives and much compute; its RPC deadline is the
  // larger of these, per step (a failing collective or a dead worker ends
  // it long before).
  static constexpr int kStepDeadlineInTimeouts = 4;
  static constexpr absl::Duration kMinStepDeadline = absl::Minutes(10);
  // How long the other ranks of a failed step get to return once their
  // mesh is aborted (they return within milliseconds: their waits are woken).
  static constexpr absl::Duration kStepFailureGrace = absl::Seconds(10);

  struct Context {
    Job* job = nullptr;
    MeshManager* meshes = nullptr;
    ControllerMetrics* metrics = nullptr;  // nullptr: none
  };
  // Puts steps first .. first + k - 1 on the wire to every rank of `mesh`
  // (which outlives the call), each collective timed out after
  // `timeout_ms` (the asking call's setting). `trace`: the ranks record
  // their spans, handed to the job's trace (controller/job_trace.h).
  StepCall(const Context& context, const baton::v1::Mesh& mesh, int first, int k, int64_t timeout_ms,
           bool trace = false);
  StepCall(const StepCall&) = delete;
  StepCall& operator=(const StepCall&) = delete;

  int first() const { return first_; }
  int last() const { return first_ + k_ - 1; }

  // Waits for every rank and records the steps: all k (OK), or those every
  // rank completed before one failed (UNAVAILABLE / INTERNAL, saying
  // which step failed where). The call's time per step runs from
  // `previous_end` (the call before it ended; InfinitePast: none) or its
  // own start, whichever is later.
  absl::Status Finish(absl::Time previous_end);
  // After an OK Finish: when the call ended, and its time per step.
  absl::Time ended() const { return ended_; }
  double step_ms() const { return step_ms_; }
  // After an OK Finish: each step's compute time (ms) by rank
  // (StepMetrics.compute_ms: its step less its waits on communication).
  const std::vector<std::vector<double>>& compute_ms_by_rank() const { return compute_ms_by_rank_; }

 private:
  // Records the first `k` steps every result holds.
  void Record(const std::vector<CallResult<baton::v1::RunStepResponse>>& results, int k) const;
  // The newest step's time by rank (JobStatus.rank_times).
  void RecordRankTimes(const std::vector<CallResult<baton::v1::RunStepResponse>>& results) const;
  // After a failed call: records the steps every rank that answered
  // completed; how many.
  int RecordCompleted(const std::vector<CallResult<baton::v1::RunStepResponse>>& results) const;

  const Context context_;
  const baton::v1::Mesh& mesh_;
  const int first_;
  const int k_;
  const bool trace_;
  const absl::Time started_;
  // The failure grace's findings (it runs on the thread that finishes the call).
  std::string why_;
  std::vector<size_t> dead_;
  // One of them: the call over the step channels, or over gRPC.
  std::unique_ptr<StepChannels::Call> channel_call_;
  std::unique_ptr<PendingFanOut<RunStepRpc>> pending_;
  absl::Time ended_;
  double step_ms_ = 0;
  std::vector<std::vector<double>> compute_ms_by_rank_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_STEP_CALL_H_
