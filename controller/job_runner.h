// JobRunner: takes one job from its placement to its end on a thread of its
// own (one per placed job, none per worker). It forms the job's mesh on the
// workers the job was given, loads its Programs and the checkpoint it
// restores, then runs the steps asked of it - all of them for a detached
// job, its client's for an attached one - each call a RunStep on every rank
// at once (a StepCall), the next call on the wire while one runs, taking
// periodic checkpoints as the spec says. One call runs K
// consecutive steps (one round trip for K): an attached job's client may say
// K (steps_per_call); a detached job's runner, and an attached one's whose
// client leaves K to it (0, what `baton run` does), takes a second's worth
// of steps at its last step time, so a stop waits a second at most. A call never runs
// past a periodic checkpoint's step or the steps asked. It ends the job
// (FINISHED, or STOPPED / FAILED with the first cause) and gives its workers
// back; when the controller shuts down it leaves the job as it is, for the
// next controller to take up.
//
//   Start ─> Place (form mesh, LoadProgram, LoadShards) ─> RUNNING
//              │ fails: detached and the fleet's fault ─> PENDING again
//              v
//     ┌──> AwaitWork ──steps asked──> RunCalls: call (K steps) ─> record, periodic save ─┐
//     │                                  the next call on the wire meanwhile <──────────┤
//     └─────────────── a save, stop, rescale or checkpoint step: none ahead <───────────┘
//          stop / failure / last step ─> End ─> workers freed
//          mesh lost / failed step, restarts left ─> Fail ─> RECOVERING ─> the
//              manager requeues it, restored from the state its live workers
//              keep (worker to worker) or else from its newest checkpoint
//          rescale asked / shrunk and workers free again ─> Move ─> RECOVERING
//              ─> requeued on its new mesh, restored worker to worker
//
// Thread-safety: the runner's thread owns the job's mesh while it runs;
// Save (a client's SaveCheckpoint) runs on an RPC thread under the job's
// work lock, between steps: the runner sends no call ahead while one waits.
#ifndef BATON_CONTROLLER_JOB_RUNNER_H_
#define BATON_CONTROLLER_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "controller/checkpoint_coordinator.h"
#include "controller/job.h"
#include "controller/mesh_manager.h"
#include "controller/step_call.h"

namespace baton {

class ControllerMetrics;  // controller/controller_metrics.h

struct RunnerContext {
  MeshManager* meshes = nullptr;
  EventLog* events = nullptr;
  ControllerMetrics* metrics = nullptr;  // nullptr: none
  CheckpointOptions checkpoints;
  // A detached job's collectives' timeout (an attached job's client says its
  // own with each Step call).
  int64_t collective_timeout_ms = 30000;
  // Writes the job's record and new log entries to the job store (durably:
  // the record is fsynced).
  std::function<void(Job&)> persist;
  // Steps done and nothing else: written by the manager's next tick (a
  // fraction of a second later) rather than fsynced after every step; a
  // restarted controller resumes from the last checkpoint either way.
  std::function<void(Job&)> persist_progress;
  // After the job ended (or went back to PENDING) and its workers are free.
  std::function<void(Job&)> on_end;
};

class JobRunner {
 public:
  static constexpr absl::Duration kLoadDeadline = absl::Seconds(60);
  // How long a restart waits for the workers the job ran on, by default.
  static constexpr int64_t kReplacementTimeoutMs = 30000;
  // A call the controller paces (a detached job's, or an attached one's
  // whose client left K to it) runs about this long: K = this / step time.
  static constexpr absl::Duration kPacedCallTarget = absl::Seconds(1);

  // `job` holds its workers (MeshManager::Reserve) already.
  JobRunner(std::shared_ptr<Job> job, RestorePlan restore, RunnerContext context);
  ~JobRunner();  // joins the thread

  void Start();
  bool finished() const { return finished_.load(); }
  Job& job() { return *job_; }
  const RestorePlan& restore() const { return restore_; }

  // A save the client asked for, between steps (or after the last one,
  // while the job still holds its workers).
  absl::StatusOr<baton::v1::CheckpointInfo> Save(const std::string& dir, bool async);
  absl::Status AwaitSave(absl::Duration timeout) { return checkpoints_.AwaitInFlight(timeout); }

 private:
  void Run();
  absl::Status Place();
  // How many steps the call from `step`, expected to start at `starts`,
  // runs (K), as `now` (the job's outlook) allows.
  int StepsForCall(const Job::Outlook& now, int step, absl::Time starts) const;
  // Runs the steps asked so far (or until something is to be taken up
  // between calls: a periodic or asked-for save, a stop, a rescale), call
  // after call, the next on the wire while one runs; records and settles
  // them, and takes the periodic checkpoints. Under the work lock.
  absl::Status RunCalls();
  // The call of the steps from `first` (StepsForCall), on the wire.
  std::unique_ptr<StepCall> StartCall(int first);
  // Whether the call after `call` may go on the wire before `call` ends.
  bool MayRunAhead(const StepCall& call) const;
  // Whether a periodic checkpoint falls on `step` (a call ends there).
  bool SavesAt(int step) const;
  // A failure of its placement (a worker died, a step failed): RECOVERING
  // while its restarts allow (its workers freed, back in line, the manager
  // restores it), else FAILED listing every failure.
  void Fail(const std::string& cause);
  // A shrunk job with enough workers free again, between steps: requeued
  // on its whole mesh (RECOVERING), its state left on its workers; whether
  // it did.
  bool GrowBack();
  // A rescale asked for, between steps: requeued on its new mesh the same
  // way; whether there was one.
  bool Rescale();
  // Leaves its mesh for another (GrowBack, Rescale): RECOVERING, back in line.
  void Move(const std::string& detail);
  // Records the steps (logged, step] from the figures the workers kept
  // (every rank that kept them all); the number recorded.
  int RecordKeptFigures(const std::vector<CallResult<baton::v1::RunStepResponse>>& figures, int logged, int step);
  // What the job leaves on its workers now.
  LiveState CurrentLiveState() const;
  // Its restore from what `live` left on live workers when they keep all of
  // it (nullopt: they do not, `why_not`, or nothing was left); UNAVAILABLE
  // when that load failed (its ranks are half-loaded).
  absl::StatusOr<std::optional<baton::v1::CheckpointInfo>> RestoreLive(const std::optional<LiveState>& live,
                                                                       const baton::v1::Mesh& mesh,
                                                                       std::string* why_not);
  // Ends the job in `state` (JOB_PENDING: back in line) and gives its
  // workers back; JOB_PENDING without a cause: the controller is shutting
  // down and the job stays as it is.
  void End(baton::v1::JobState state, const std::string& cause);
  // The job's new state (FINISHED turns FAILED when its saves failed),
  // its workers freed first (unless an attached job FINISHED), logged,
  // persisted; whether it FINISHED.
  bool Conclude(baton::v1::JobState state, const std::string& cause);
  // Gives the job's workers back (its mesh aborted); they keep its state
  // for its next placement unless it `ended`.
  void FreeWorkers(const std::string& reason, bool ended = false);
  // FreeWorkers, and tells the manager.
  void Release(const std::string& reason, bool ended);

  const std::shared_ptr<Job> job_;
  const RestorePlan restore_;
  const RunnerContext context_;
  CheckpointCoordinator checkpoints_;
  baton::v1::Mesh mesh_;  // the runner thread's; Save reads it under the work lock
  double last_step_ms_ = 0;  // the runner thread's: the last call's time per step
  absl::Time wire_free_ = absl::InfinitePast();  // the runner thread's: when the calls on the wire should end
  std::atomic<int> saves_waiting_{0};  // Saves waiting for the work lock
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_RUNNER_H_
