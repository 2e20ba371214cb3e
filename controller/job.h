// Job: one job the controller owns. What it is (its spec and compiled plan)
// never changes; what it does (its status, its state, its log, its lease and
// the steps asked of it) changes under its own mutex, so jobs never wait on
// each other.
//
// Its states and their transitions are drawn once, in docs/control_plane.md
// ("Jobs"); the transitions that decide are Job's methods, under its lock.
// FINISHED, STOPPED, FAILED and UNREADABLE are final (common/job_state.h).
// Every state change and every completed step is an entry of the job's log:
// the log is what counts, so a step is counted everywhere (status, metrics,
// Step's answer, `baton logs`) or nowhere.
//
// Thread-safety: every method may be called from any thread. The job's
// runner (controller/job_runner.h) advances it; RPC threads read it, ask
// for steps and wait for them, renew its lease and ask it to stop.
#ifndef BATON_CONTROLLER_JOB_H_
#define BATON_CONTROLLER_JOB_H_

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/job_state.h"
#include "controller/lease.h"
#include "controller/job_placement.h"
#include "controller/job_trace.h"
#include "controller/sequenced_log.h"
#include "controller/step_ledger.h"
#include "proto/controller.pb.h"
#include "proto/controller_state.pb.h"
#include "strategies/dry_run.h"

namespace baton {

class Job {
 public:
  // Entries of a job's log kept in memory (the newest).
  static constexpr size_t kLogCapacity = 10000;
  using Log = SequencedLog<baton::v1::JobLogEntry>;

  // `record`: the spec (defaults applied) and the status to start from;
  // `plan`: its Programs (with its id), compiled once.
  Job(baton::v1::JobRecord record, std::shared_ptr<const JobPlan> plan);

  const std::string& id() const { return id_; }
  // What was submitted (its mesh as submitted).
  const baton::v1::JobSpec& spec() const { return spec_; }
  // What it is placed with now (controller/job_placement.h): its own mesh and,
  // shrunk, the smaller one. Swapped whole (Place), never changed.
  std::shared_ptr<const JobPlacement> placement() const ABSL_LOCKS_EXCLUDED(mu_);
  void Place(std::shared_ptr<const JobPlacement> placement) ABSL_LOCKS_EXCLUDED(mu_);
  // Periodic saves failed in a row (status().checkpoint_failures(), without
  // copying the status).
  int checkpoint_failures() const ABSL_LOCKS_EXCLUDED(mu_);
  // A rescale asked for (RescaleJob), for the runner to take between steps.
  // Refused (FAILED_PRECONDITION) while an earlier one is asked and not yet
  // applied: status().rescale() says which, and then what became of it.
  absl::Status RequestRescale(baton::v1::JobSpec own, std::shared_ptr<const JobPlan> plan,
                              const std::string& request_id) ABSL_LOCKS_EXCLUDED(mu_);
  bool TakeRescale(baton::v1::JobSpec* own, std::shared_ptr<const JobPlan>* plan) ABSL_LOCKS_EXCLUDED(mu_);
  // Its Programs and what they predict (placement()->plan); once it ended,
  // what they predicted only (ReleasePrograms: an ended job holds no
  // Program).
  std::shared_ptr<const JobPlan> plan() const ABSL_LOCKS_EXCLUDED(mu_);
  void ReleasePrograms() ABSL_LOCKS_EXCLUDED(mu_);
  bool detached() const { return detached_; }
  int steps() const { return spec_.steps(); }

  baton::v1::JobStatus status() const ABSL_LOCKS_EXCLUDED(mu_);
  baton::v1::JobState state() const ABSL_LOCKS_EXCLUDED(mu_);
  int step() const ABSL_LOCKS_EXCLUDED(mu_);
  bool ended() const ABSL_LOCKS_EXCLUDED(mu_);
  // What the job store keeps of it.
  baton::v1::JobRecord Record() const ABSL_LOCKS_EXCLUDED(mu_);
  Log& log() { return log_; }

  // Moves to `to` (with `cause` as the error of FAILED and STOPPED) and logs
  // the change; false, changing nothing, once the job has ended.
  bool Enter(baton::v1::JobState to, const std::string& cause = "") ABSL_LOCKS_EXCLUDED(mu_);
  // Placed on `mesh`, or (an empty mesh) off it.
  void SetMesh(const baton::v1::Mesh& mesh) ABSL_LOCKS_EXCLUDED(mu_);
  void SetWaitingFor(const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  // Where a (re)placed job starts: the restored step and its data seed.
  void SetStart(int step, uint64_t data_seed, const baton::v1::CheckpointInfo& restored) ABSL_LOCKS_EXCLUDED(mu_);
  // A completed step (comm_bytes: all ranks together): counted and logged.
  void RecordStep(const baton::v1::StepMetrics& m, int64_t comm_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // A published save; and a failed one (a periodic one counts towards
  // checkpoint.max_failures), returning how many failed in a row.
  void RecordCheckpoint(const baton::v1::CheckpointInfo& info) ABSL_LOCKS_EXCLUDED(mu_);
  int RecordCheckpointFailure(const std::string& why, bool periodic) ABSL_LOCKS_EXCLUDED(mu_);
  void SetCheckpointInFlight(int step) ABSL_LOCKS_EXCLUDED(mu_);

  // Why the runner should stop working on it ("" while it should go on).
  enum class Interrupt { kNone, kStop, kMeshLost, kShutdown };
  // Asks it to stop (StopJob, a lapsed lease); the first cause is kept.
  void RequestStop(const std::string& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // Mesh `mesh_id` was aborted under it (a worker died); ignored unless it
  // is the job's mesh now.
  void NoteMeshLost(const std::string& mesh_id, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // The controller is shutting down: the runner leaves it as it is (a
  // restarted controller takes it up again).
  void RequestShutdown() ABSL_LOCKS_EXCLUDED(mu_);
  Interrupt interrupt(std::string* why = nullptr) const ABSL_LOCKS_EXCLUDED(mu_);

  // The steps asked of it. Detached jobs ask for all of them; an attached
  // job's client asks for `n` more (after the one running, if any) and gets
  // the step to wait for, and withdraws what is not started yet when it
  // stops waiting. `settings`: how the asking call has them run (its K, its
  // collectives' timeout, when it stops waiting): they travel with the ask.
  int RequestSteps(int n, const CallSettings& settings) ABSL_LOCKS_EXCLUDED(mu_);
  void WithdrawSteps() ABSL_LOCKS_EXCLUDED(mu_);
  // What the runner decides from between calls, read under one lock (never
  // from separate reads that a client's call could change in between).
  struct Outlook {
    Interrupt interrupt = Interrupt::kNone;
    std::string why;  // the interrupt's cause
    int step = 0;
    int target_step = 0;
    CallSettings call;  // the newest ask's
    bool rescale_asked = false;
    bool shrunk = false;
    int checkpoint_failures = 0;
    bool has_work() const { return target_step > step; }
  };
  Outlook outlook() const ABSL_LOCKS_EXCLUDED(mu_);
  // The runner: waits until a step (or a rescale) is asked for or it is
  // interrupted (or `timeout`); the outlook then (its interrupt kNone when
  // there is a step or a rescale to run).
  Outlook AwaitWork(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // `n` more steps are on the wire (each RecordStep takes one off); after
  // a failed call none is.
  void AddStepsRunning(int n) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearStepsRunning() ABSL_LOCKS_EXCLUDED(mu_);
  // The runner: everything of `step` is done (its periodic save too).
  void SettleStep(int step) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `step` is done (SettleStep), the job ended or the deadline;
  // whether the step settled.
  bool AwaitStep(int step, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the job left PENDING (placed, or ended) or the deadline.
  void AwaitPlaced(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // An attached job's client's hold on it (controller/lease.h).
  Lease& lease() { return lease_; }
  // Its trace in the making (TraceJob; controller/job_trace.h).
  JobTrace& trace() { return trace_; }

  // Held while a step or a save of this job runs: one at a time.
  absl::Mutex& work_mu() { return work_mu_; }

  // Supervision (RestartPolicy; the rest of it is the job's supervisor's,
  // controller/job_supervisor.h). The restarts its spec allows: restart.
  // max_restarts, or when that is unset 3 for a detached job and 0 for an
  // attached one.
  int restarts_allowed() const { return restarts_allowed_; }
  // A failure that ends its placement: recorded with its time and step;
  // true when a restart remains, the restart counted and the job RECOVERING
  // in the same update (no reader sees the failure while it says RUNNING).
  bool NoteFailure(const std::string& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // Every failure recorded, oldest first, each with its time and step: what
  // a job that spent its restarts fails with.
  std::string FailureHistory() const ABSL_LOCKS_EXCLUDED(mu_);
  // A rank named slow (StragglerPolicy): kept in its status, the newest
  // kMaxStragglers.
  static constexpr int kMaxStragglers = 16;
  void RecordStraggler(baton::v1::Straggler straggler) ABSL_LOCKS_EXCLUDED(mu_);
  // Where each rank's newest step went (status().rank_times), by rank.
  void RecordRankTimes(std::vector<baton::v1::RankTime> times) ABSL_LOCKS_EXCLUDED(mu_);
  // Placed again: a lost mesh's interrupt no longer applies.
  void ClearMeshLost() ABSL_LOCKS_EXCLUDED(mu_);
  // Why the job table could not record its last change; "" once it could.
  void SetRecordError(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Outlook OutlookLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string id_;
  const baton::v1::JobSpec spec_;
  const bool detached_;
  const int restarts_allowed_;
  Log log_{kLogCapacity};
  Lease lease_;
  JobTrace trace_;
  absl::Mutex work_mu_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const JobPlacement> placement_ ABSL_GUARDED_BY(mu_);
  std::optional<std::pair<baton::v1::JobSpec, std::shared_ptr<const JobPlan>>> rescale_ ABSL_GUARDED_BY(mu_);
  baton::v1::JobStatus status_ ABSL_GUARDED_BY(mu_);
  Interrupt interrupt_ ABSL_GUARDED_BY(mu_) = Interrupt::kNone;
  std::string interrupt_cause_ ABSL_GUARDED_BY(mu_);
  StepLedger ledger_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_H_
