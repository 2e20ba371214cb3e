// JobManager: the job table, its queue and its store - nothing more. Jobs
// by id (each a Job with its own lock and state machine), a supervisor per
// job that has not ended (controller/job_supervisor.h: it owns the job's
// life, placement to end, restarts and moves included), the queue of jobs
// waiting for workers, attached jobs' leases, and the job store behind
// them. Admission in job_admission.cc, recovery at start-up in
// job_recovery.cc, the calls an attached job's client makes (and rescale)
// in job_calls.cc.
//
//   SubmitJob ──> PENDING, queued ──Schedule: first in line, workers free──┐
//   CreateJob ──> workers reserved at once, or RESOURCE_EXHAUSTED ─────────┤
//                                                                          v
//           its supervisor runs it ──> ended, or back in line (first) ──> ...
//
// The queue is first come, first served: the job at its head waits until
// enough workers are free (those its spec names, or any), and the ones
// behind it wait for it. An attached job takes free workers at once or is
// refused, naming how many it needs and how many are free.
//
// Thread-safety: every method may be called from any thread. `mu_` guards
// the tables; it is never held across an RPC, a runner's work, a compile,
// a disk read or a wait on a job. A supervisor's lock is taken after it.
#ifndef BATON_CONTROLLER_JOB_MANAGER_H_
#define BATON_CONTROLLER_JOB_MANAGER_H_

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/checkpoint_coordinator.h"
#include "controller/job.h"
#include "controller/job_runner.h"
#include "controller/job_supervisor.h"
#include "controller/job_store.h"
#include "controller/mesh_manager.h"

namespace baton {

class ControllerMetrics;

struct JobManagerOptions {
  CheckpointOptions checkpoints;
  // Attached jobs: how long their client may be silent (CreateJob's lease_ms
  // when given, within [kMinLease, kMaxLease]).
  absl::Duration default_lease = absl::Seconds(10);
  // Ended jobs kept (listed, their logs readable); the oldest are forgotten.
  size_t max_ended_jobs = 1000;
  // A detached job whose placement failed for the fleet's sake waits this
  // long before it is tried again.
  absl::Duration retry_backoff = absl::Seconds(1);
  // The per-collective timeout of detached jobs' steps.
  int64_t collective_timeout_ms = 30000;
  // For this long after the controller starts its fleet is still
  // registering (a restarted controller's workers come back within a few
  // seconds): a job needing more workers than are registered, or naming one
  // that is not, is queued rather than refused. So is any job while no
  // worker is registered at all.
  absl::Duration registration_grace = absl::Seconds(10);
};

class JobManager {
 public:
  static constexpr absl::Duration kMinLease = absl::Milliseconds(100);
  static constexpr absl::Duration kMaxLease = absl::Hours(24);
  // StopJob waits this long for a running job to reach STOPPED.
  static constexpr absl::Duration kStopWait = absl::Seconds(15);
  // A streamed Step answers at most this often (a progress bar's pace, four
  // a second): steps that settle sooner travel together in the next part.
  // A part per ~1 ms step cost the client and the controller ~0.15 ms of
  // CPU a step, and at 25 ms a ~20 ms step still got a part of its own (0.5
  // ms of CPU a step, bench/dispatch.sh), on the cores the workers need;
  // each part wakes a thread or two at both ends.
  static constexpr absl::Duration kStepPartInterval = absl::Milliseconds(250);

  JobManager(MeshManager* meshes, EventLog* events, ControllerMetrics* metrics, JobStore* store,
             JobManagerOptions options);
  ~JobManager();  // Shutdown()

  // Reads the job table the store holds: ended jobs as they were; detached
  // jobs that were pending or running go back to PENDING, resuming from
  // their last complete checkpoint (or from step 0); attached ones FAIL
  // with "the controller restarted" (their client's next call says so).
  void Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // A detached job, validated (nothing is touched when it is invalid) and
  // queued.
  absl::StatusOr<std::shared_ptr<Job>> Submit(const baton::v1::CreateJobRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // An attached job: placed on free workers at once and loaded (by
  // `deadline`); RESOURCE_EXHAUSTED when too few are free.
  absl::StatusOr<std::shared_ptr<Job>> Create(const baton::v1::CreateJobRequest& req, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for an unknown id.
  absl::StatusOr<std::shared_ptr<Job>> Find(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Job>> Jobs() const ABSL_LOCKS_EXCLUDED(mu_);

  // Stops a job: a pending one at once, a running one once its step in
  // flight is aborted (waits up to kStopWait). Its workers are free after.
  absl::StatusOr<baton::v1::JobStatus> Stop(const std::string& id, const std::string& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks a running job to move onto `mesh` (its axes, resized) at its next
  // step boundary, worker to worker. INVALID_ARGUMENT when the mesh does
  // not fit its plan, FAILED_PRECONDITION unless it is RUNNING or while an
  // earlier rescale is not yet applied, RESOURCE_EXHAUSTED when the fleet
  // has too few workers for it. The status's `rescale` follows it (ASKED,
  // then APPLIED or FAILED); a retry with the same `request_id` gets that
  // status and asks nothing again.
  absl::StatusOr<baton::v1::JobStatus> Rescale(const std::string& id, const std::vector<baton::v1::MeshAxis>& mesh,
                                               const std::string& request_id = "");

  struct StepOutcome {
    std::vector<baton::v1::StepMetrics> metrics;
    std::vector<baton::v1::CheckpointInfo> checkpoints;
    std::vector<std::string> checkpoint_errors;
    baton::v1::JobStatus status;
  };
  // Takes what steps settled before the last ones asked (with the job's
  // status then); false when the caller has left.
  using StepReport = std::function<bool(StepOutcome&&)>;
  // Asks an attached job for `n` more steps, up to `per_call` of them in one
  // call to the workers, and waits for them until `deadline` (or
  // `cancelled` says the caller left). Steps running then complete on their
  // own and are counted; steps not started are withdrawn. What the job's log
  // gains meanwhile is returned - with `report`, given to it as steps
  // settle (the runner goes on meanwhile), and the rest returned at the end.
  absl::StatusOr<StepOutcome> Step(const std::string& id, int n, int per_call, int64_t collective_timeout_ms,
                                   absl::Time deadline, const std::function<bool()>& cancelled,
                                   const StepReport& report = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Renews an attached job's lease.
  absl::StatusOr<baton::v1::JobStatus> KeepAlive(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<baton::v1::CheckpointInfo> Save(const std::string& id, const std::string& dir, bool async)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for the job's async save; its status after.
  absl::StatusOr<baton::v1::JobStatus> AwaitSave(const std::string& id, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The monitor, a few times a second: lapsed leases stop their jobs,
  // pending jobs are placed, runners of ended jobs are joined, the oldest
  // ended jobs forgotten.
  void Tick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // MeshManager's report: `owner`'s mesh was aborted under it.
  void OnMeshLost(const std::string& owner, const baton::v1::Mesh& mesh, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops every runner, leaving the jobs as they are for the next
  // controller.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Validated, compiled and its restore planned; not yet in the table.
  struct Prepared {
    std::shared_ptr<Job> job;
    RestorePlan restore;
  };
  absl::StatusOr<Prepared> Prepare(const baton::v1::CreateJobRequest& req, bool detached);
  // What a detached job placed when the previous controller died left on
  // its workers: its Programs on that mesh, the workers by rank (names
  // only), the step its record holds and the last one its log (`log`)
  // does. nullopt when it was not placed (or its plan no longer compiles).
  // `own`: the Programs of its own mesh, compiled already (used when it ran
  // on that mesh; a shrunk job's are compiled here).
  static std::optional<LiveState> LeftOnWorkers(const baton::v1::JobRecord& record,
                                                const std::vector<baton::v1::JobLogEntry>& log,
                                                std::shared_ptr<const JobPlan> own);
  // Compiles `record`'s job and plans what it restores (`resume_from`
  // overriding the spec's). `checked`: its spec passed WithDefaults and
  // ValidateJobSpec already (Prepare); a record read back from the table is
  // checked again.
  absl::StatusOr<Prepared> Compile(baton::v1::JobRecord record, const std::string& resume_from, bool checked = false);
  // Places queued jobs, first in line first, while workers allow; a
  // RECOVERING job at the head that too few free workers hold up is asked
  // to shrink (its supervisor does it, on its own thread; it holds the line
  // meanwhile).
  void Schedule() ABSL_LOCKS_EXCLUDED(mu_);
  // A supervisor for `job` (which will load `restore`), in the table; its
  // thread started by the caller after the table holds it.
  std::shared_ptr<JobSupervisor> Supervise(const std::shared_ptr<Job>& job, RestorePlan restore)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A supervisor's report: its job is back in line (first), or ended.
  void Requeue(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void Done(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Admission's last checks, then the job's first record made durable, and
  // only then the job in the table (under admit_mu_, so two submissions
  // cannot both pass): its checkpoint.dir in no other live job's use (their
  // saves would replace each other's files), and the record written - a job
  // the table cannot hold is refused with the disk's error, never
  // acknowledged and then lost.
  absl::Status Admit(const std::shared_ptr<Job>& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(admit_mu_)
      ABSL_LOCKS_EXCLUDED(mu_, persist_mu_);
  // Writes the job's record and its new log entries to the store (not a
  // JOB_UNREADABLE one's: its file stays as it was found). A failure is
  // logged and shown in the job's status (record_error) until a write
  // succeeds.
  void Persist(Job& job) ABSL_LOCKS_EXCLUDED(persist_mu_);
  // Writes the jobs whose steps advanced since they were last written: at
  // most once per kProgressInterval unless `now`. A record is replaced
  // durably (two fsyncs); a state change is written at once (Persist), steps
  // alone need not be: a requeued job resumes from its checkpoint.
  static constexpr absl::Duration kProgressInterval = absl::Seconds(1);
  void WriteProgress(bool now) ABSL_LOCKS_EXCLUDED(mu_, persist_mu_);
  // Drops the oldest ended jobs past options_.max_ended_jobs from the table;
  // returns them (id, state) for Tick to remove their files outside mu_.
  std::vector<std::pair<std::string, baton::v1::JobState>> Forget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The runner of job `id` while it holds workers, else nullptr.
  std::shared_ptr<JobRunner> RunnerOf(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<JobSupervisor> SupervisorOf(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);

  MeshManager* const meshes_;
  EventLog* const events_;
  ControllerMetrics* const metrics_;
  JobStore* const store_;
  const JobManagerOptions options_;
  const absl::Time started_ = absl::Now();

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // ids, oldest first
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);   // jobs waiting for workers, first in line first
  // Of the jobs that have not ended.
  std::map<std::string, std::shared_ptr<JobSupervisor>> supervisors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<JobSupervisor>> finished_ ABSL_GUARDED_BY(mu_);  // joined by Tick
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex admit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // One job's writes, in order: the log sequence it has written.
  struct JobWriter {
    absl::Mutex mu;
    int64_t written ABSL_GUARDED_BY(mu) = 0;
  };
  // Bookkeeping only, never held while writing: a step's path takes it
  // (persist_progress), so one job's slow fsync stalls no other job's
  // steps, and no heartbeat.
  absl::Mutex persist_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, std::shared_ptr<JobWriter>> writers_ ABSL_GUARDED_BY(persist_mu_);
  std::set<std::string> unwritten_ ABSL_GUARDED_BY(persist_mu_);  // steps done, not written yet
  absl::Time progress_written_ ABSL_GUARDED_BY(persist_mu_) = absl::InfinitePast();
  std::shared_ptr<JobWriter> WriterOf(const std::string& id) ABSL_LOCKS_EXCLUDED(persist_mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_MANAGER_H_
