// JobSupervisor: one job's life, from admission to its end, on one thread
// of its own. It owns the whole loop and every decision in it:
//
//   queued ──workers reserved (Place)──> run (a JobRunner) ──> its Outcome:
//     ended ─────────────────────────────────────────────────────> done
//     failed ─ restarts left? ─ no ──> FAILED ───────────────────> done
//              yes: RECOVERING, its state left on its workers ─┐
//     rescale asked / shrunk and workers free (grow back) / ──┤ the new placement
//     a rank named slow (EVICT: kept off its worker a while) ──┤
//     placing failed: the fleet's fault ─> retry │ a checkpoint  │ swapped whole,
//              of its own unloadable ─> the next older one ────┤ its restore planned
//                                                              v (from disk, outside
//   queued again, first in line (after its backoff) <──────────┘  any lock)
//   queued, RECOVERING, too few workers free past its wait ─(AskShrink)─> shrunk
//     onto what is free (RestartPolicy.min_workers), still first in line
//
// It holds what only recovery uses: the restore planned from disk, what the
// last mesh left on its workers (LiveState), the workers a restart waits
// for and until when, when it may be placed again, and which of its
// checkpoints cannot be loaded. The restart budget's decision is the Job's
// NoteFailure (the failure and RECOVERING in one update); the rest of
// RestartPolicy (replacement timeout, backoff, min_workers) is here. The
// job table (JobManager) only queues it, hands it workers and hears when
// it is back in line or done.
//
// Thread-safety: every public method may be called from any thread; `mu_`
// is taken after JobManager's table lock (the schedule calls wants(),
// Place and AskShrink under it), and never held across a call into the
// manager, a runner or the disk.
#ifndef BATON_CONTROLLER_JOB_SUPERVISOR_H_
#define BATON_CONTROLLER_JOB_SUPERVISOR_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/checkpoint_coordinator.h"
#include "controller/job.h"
#include "controller/job_runner.h"
#include "controller/live_restore.h"

namespace baton {

struct SupervisorContext {
  // What its runners get; `published` is the supervisor's own.
  RunnerContext runner;
  // A detached job whose placement failed for the fleet's sake waits this
  // long before it is tried again.
  absl::Duration retry_backoff = absl::Seconds(1);
  // It is back in line, first (a restart, a move, a retry), or shrunk and
  // ready to be placed: the table queues it (when it is not) and
  // schedules.
  std::function<void(const std::string& id)> requeue;
  // It ended (or the controller is shutting down): its thread is about to
  // return, its workers are free.
  std::function<void(const std::string& id)> done;
};

class JobSupervisor {
 public:
  // How long a restart waits for the workers the job ran on, by default.
  static constexpr int64_t kReplacementTimeoutMs = 30000;
  // The pause before a failed job is placed again (RestartPolicy.backoff_ms).
  static constexpr int64_t kRestartBackoffMs = 1000;
  // How long a job keeps off a worker it left as slow (StragglerPolicy.
  // evict_ms), by default.
  static constexpr int64_t kEvictMs = 60000;

  // `job` is in the table; `restore` is what it loads from disk when placed.
  JobSupervisor(std::shared_ptr<Job> job, RestorePlan restore, SupervisorContext context);
  ~JobSupervisor();  // Shutdown() and joins its thread

  // A restarted controller found the job placed on `live`'s workers: the
  // job waits for them until `until`, and restores from what they keep.
  // Before Start.
  void ResumeOn(LiveState live, absl::Time until) ABSL_LOCKS_EXCLUDED(mu_);
  void Start();

  Job& job() const { return *job_; }
  const std::shared_ptr<Job>& shared_job() const { return job_; }

  // What the queue needs to place it now.
  struct Wants {
    std::vector<std::string> own_workers;  // a restart waits for these (empty: none)
    absl::Time not_before = absl::InfinitePast();
    bool shrinking = false;  // it holds the line meanwhile
    std::set<std::string> avoid;  // workers it keeps off for now (evicted as slow)
  };
  Wants wants(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  // Workers reserved for it (MeshManager::Reserve), taken off the queue:
  // it runs on them. `fits`: the fit check was made on them already.
  void Place(std::vector<baton::v1::WorkerInfo> reserved, bool fits = false) ABSL_LOCKS_EXCLUDED(mu_);
  // Too few workers are free for it (RECOVERING, past its wait): it shrinks
  // onto those free if its RestartPolicy lets it, on its own thread.
  void AskShrink() ABSL_LOCKS_EXCLUDED(mu_);
  // Off the queue, it is stopped (a placed one by its runner).
  void Stop(const std::string& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // The controller shuts down: its thread returns, the job left as it is.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Its runner while it holds workers (a client's Save holds it), else
  // nullptr.
  std::shared_ptr<JobRunner> runner() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether workers are reserved for it or it runs on them.
  bool holds_workers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Its thread has returned (or never started).
  bool done() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  // Waits in line for its turn: workers, a shrink, a stop or the shutdown.
  enum class Turn { kPlace, kShrink, kStop, kShutdown };
  Turn AwaitTurn(std::vector<baton::v1::WorkerInfo>* reserved, bool* fits) ABSL_LOCKS_EXCLUDED(mu_);
  // One placement on `reserved`: whether the job goes back in line.
  bool RunOn(const std::vector<baton::v1::WorkerInfo>& reserved, bool fits);
  // What follows its runner's `outcome`: whether it goes back in line.
  bool TakeUp(JobRunner& runner, const RunOutcome& outcome, bool was_recovering);
  // Its placement failed: a retry, an older checkpoint or the end.
  bool PlacingFailed(JobRunner& runner, const absl::Status& status, bool was_recovering);
  // Its mesh was lost or a step failed: a restart while they remain.
  bool Failed(JobRunner& runner, const std::string& cause);
  // Off worker `worker`, named slow: kept off it for a while, placed as a
  // restart is (shrunk when too few others are free).
  bool Evict(JobRunner& runner, const std::string& worker);
  // Free workers it may take now: those it keeps off (evicted as slow) not
  // counted.
  int FreeForIt() const ABSL_LOCKS_EXCLUDED(mu_);
  // Onto another mesh (a rescale, a grow-back), its state left on its
  // workers.
  bool Move(JobRunner& runner, std::shared_ptr<const JobPlacement> to, const std::string& detail);
  // Back in line after `pause`: a RECOVERING job's restore planned again
  // (its newest loadable checkpoint; its live state, when it has some, is
  // tried first once placed); false when none can be (it FAILED).
  bool Requeue(absl::Duration pause);
  // Ends it while it holds no worker (stopped in line, or found not to fit).
  void EndUnplaced(baton::v1::JobState state, const std::string& cause, const std::vector<baton::v1::WorkerInfo>& held);

  // Recovery (job_supervisor_recovery.cc). What a RECOVERING job placed as
  // `placement` restores from disk: its newest loadable checkpoint, or its
  // start.
  absl::StatusOr<RestorePlan> PlanRecovery(const JobPlacement& placement) ABSL_LOCKS_EXCLUDED(mu_);
  // Reshapes it onto as many workers as are free (no fewer than
  // restart.min_workers) by shrinking its data-parallel axis, compiled and
  // its restore planned; FAILED_PRECONDITION when it may not or cannot.
  absl::Status Shrink() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration RestartBackoff() const;

  const std::shared_ptr<Job> job_;
  const SupervisorContext context_;

  mutable absl::Mutex mu_;
  RestorePlan restore_ ABSL_GUARDED_BY(mu_);
  std::optional<LiveState> live_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> own_workers_ ABSL_GUARDED_BY(mu_);
  absl::Time own_workers_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time not_before_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Its checkpoints that failed to load for what they hold: path -> why.
  std::map<std::string, std::string> unloadable_ ABSL_GUARDED_BY(mu_);
  // Workers it left as slow, and until when it keeps off them.
  std::map<std::string, absl::Time> avoid_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<baton::v1::WorkerInfo>> reserved_ ABSL_GUARDED_BY(mu_);
  bool fits_ ABSL_GUARDED_BY(mu_) = false;
  bool shrink_asked_ ABSL_GUARDED_BY(mu_) = false;
  bool shrinking_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_cause_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = true;  // until Start
  std::shared_ptr<JobRunner> runner_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_SUPERVISOR_H_
