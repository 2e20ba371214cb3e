// JobRunner: one placement of a job, run on its supervisor's thread
// (controller/job_supervisor.h owns the job's life; a runner, one stretch
// of it). It forms the job's mesh on the workers reserved for it, loads its
// Programs and the state it restores (from live workers when they keep all
// of it, else from its checkpoint), then runs the steps asked of it - all
// of them for a detached job, its client's for an attached one - each call
// a RunStep on every rank at once (a StepCall), the next call on the wire
// while one runs, taking periodic checkpoints as the spec says. One call
// runs K consecutive steps (one round trip for K): an attached job's client
// may say K (steps_per_call); a detached job's runner, and an attached
// one's whose client leaves K to it (0, what `baton run` does), takes a
// second's worth of steps at its last step time, so a stop waits a second
// at most. A call never runs past a periodic checkpoint's step or the steps
// asked.
//
// What ends it is its Outcome. It concludes what is decided already (the
// last step, a stop, a bad request, its saves failing) itself; a failure,
// a rescale, a grow-back or a failed placement it hands to its supervisor
// with the workers still held, for the supervisor to decide (a restart, a
// move, a retry, or the end) and then to free them through Conclude or
// Leave.
//
//   Run: Place (form mesh, LoadProgram, restore) ─> RUNNING
//     ┌──> AwaitWork ──steps asked──> RunCalls: call (K steps) ─> record, periodic save ─┐
//     │                                  the next call on the wire meanwhile <──────────┤
//     └─────────────── a save, stop, rescale or checkpoint step: none ahead <───────────┘
//          stop / last step / saves failing ─> Conclude ─> kEnded (workers freed)
//          shutdown ─> kShutdown (workers freed, the job left as it is)
//          placing failed ─> kPlaceFailed │ mesh lost, a step failed ─> kFailed
//          rescale asked ─> kRescale      │ shrunk, workers free again ─> kGrowBack
//
// Thread-safety: the supervisor's thread runs it and owns its mesh; Save
// (a client's SaveCheckpoint) runs on an RPC thread under the job's work
// lock, between steps: the runner sends no call ahead while one waits.
#ifndef BATON_CONTROLLER_JOB_RUNNER_H_
#define BATON_CONTROLLER_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "controller/checkpoint_coordinator.h"
#include "controller/job.h"
#include "controller/live_restore.h"
#include "controller/mesh_manager.h"
#include "controller/step_call.h"
#include "controller/straggler_detector.h"

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
  // restarted controller resumes from its workers or its checkpoint either
  // way.
  std::function<void(Job&)> persist_progress;
  // A save published at this path: loadable again (its supervisor's).
  std::function<void(const std::string&)> published;
  // How many free workers the job may take now (less those it keeps off,
  // evicted as slow; its supervisor's): what its grow-back counts.
  std::function<int()> free_workers;
};

// What ended a placement.
struct RunOutcome {
  enum class Kind {
    kEnded,        // FINISHED, STOPPED or FAILED: concluded, its workers freed
    kShutdown,     // the controller shuts down: the job left as it is, workers freed
    kPlaceFailed,  // forming, loading or restoring failed (`status`); workers held
    kFailed,       // its mesh was lost or a step failed (`cause`); workers held
    kRescale,      // a rescale is asked; workers held
    kGrowBack,     // shrunk, and enough workers are free for its own mesh; workers held
    kEvict,        // a rank named slow (StragglerPolicy EVICT) on worker `cause`; workers held
  };
  Kind kind = Kind::kEnded;
  absl::Status status;
  std::string cause;
};

class JobRunner {
 public:
  static constexpr absl::Duration kLoadDeadline = absl::Seconds(60);
  // A call the controller paces (a detached job's, or an attached one's
  // whose client left K to it) runs about this long: K = this / step time.
  static constexpr absl::Duration kPacedCallTarget = absl::Seconds(1);

  // `job` holds its workers (MeshManager::Reserve) already. `restore`: what
  // it loads from disk; `live`: what its last mesh left on live workers,
  // restored from instead when they keep all of it.
  JobRunner(std::shared_ptr<Job> job, RestorePlan restore, std::optional<LiveState> live, RunnerContext context);

  // Places the job and runs it until its Outcome.
  RunOutcome Run();
  Job& job() { return *job_; }
  // The mesh it formed (empty until then).
  const baton::v1::Mesh& mesh() const { return mesh_; }
  // What the job leaves on its workers now.
  LiveState LiveLeft() const;

  // The job's new state (FINISHED turns FAILED when its saves failed), its
  // workers freed first (unless an attached job FINISHED) - kept for its
  // next placement unless it ended - logged, persisted; whether it
  // FINISHED.
  bool Conclude(baton::v1::JobState state, const std::string& cause);
  // Gives the job's workers back (its mesh aborted); they keep its state
  // for its next placement unless it `ended`.
  void Leave(const std::string& reason, bool ended = false);

  // A save the client asked for, between steps (or after the last one,
  // while the job still holds its workers).
  absl::StatusOr<baton::v1::CheckpointInfo> Save(const std::string& dir, bool async);
  absl::Status AwaitSave(absl::Duration timeout) { return checkpoints_.AwaitInFlight(timeout); }

 private:
  absl::Status Place();
  // Concluded in `state`: kEnded.
  RunOutcome End(baton::v1::JobState state, const std::string& cause);
  // The controller shuts down: the job left as it is, its workers freed.
  RunOutcome ShutDown();
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
  // Feeds a finished call's compute times to the straggler detector; a rank
  // named is recorded (status, event) and, with EVICT, its worker is left.
  void WatchStragglers(const StepCall& call);
  // Enough workers free (less those it keeps off) for a shrunk job's own
  // mesh.
  bool MayGrowBack() const;
  // Records the steps (logged, step] from the figures the workers kept
  // (every rank that kept them all); the number recorded.
  int RecordKeptFigures(const std::vector<CallResult<baton::v1::RunStepResponse>>& figures, int logged, int step);
  // Its restore from what `live` left on live workers when they keep all of
  // it (nullopt: they do not, `why_not`, or nothing was left); UNAVAILABLE
  // when that load failed (its ranks are half-loaded).
  absl::StatusOr<std::optional<baton::v1::CheckpointInfo>> RestoreLive(const std::optional<LiveState>& live,
                                                                       const baton::v1::Mesh& mesh,
                                                                       std::string* why_not);
  const std::shared_ptr<Job> job_;
  const RestorePlan restore_;
  const std::optional<LiveState> live_;
  const RunnerContext context_;
  CheckpointCoordinator checkpoints_;
  baton::v1::Mesh mesh_;  // the runner thread's; Save reads it under the work lock
  double last_step_ms_ = 0;  // the runner thread's: the last call's time per step
  absl::Time wire_free_ = absl::InfinitePast();  // the runner thread's: when the calls on the wire should end
  std::atomic<int> saves_waiting_{0};  // Saves waiting for the work lock
  std::optional<StragglerDetector> stragglers_;  // the runner thread's (StragglerPolicy)
  std::string evict_;  // the runner thread's: the worker an EVICT leaves
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_RUNNER_H_
