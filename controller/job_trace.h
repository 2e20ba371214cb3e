// JobTrace: a job's trace in the making (TraceJob, `baton trace`). A client
// arms it for the job's next N steps; the runner then asks each call's
// ranks to record their spans (RunStepRequest.trace), and each call that
// ends well hands them in, until N consecutive steps on one mesh are
// recorded. The asking client waits for them (Await) while the job goes
// on: nothing restarts, and steps run as they would untraced.
//
// One trace at a time per job: a client that arms one while another is
// being recorded, or recorded and not yet taken, shares it (an attached
// job's client arms, runs the steps itself, then asks for what they
// recorded). Steps that do not follow the ones recorded (the job was
// restored at an earlier step, or moved to another mesh) start it over.
//
// Thread-safe.
#ifndef BATON_CONTROLLER_JOB_TRACE_H_
#define BATON_CONTROLLER_JOB_TRACE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/mesh.pb.h"
#include "proto/trace.pb.h"
#include "proto/worker.pb.h"
#include "strategies/dry_run.h"

namespace baton {

class JobTrace {
 public:
  static constexpr int kMaxSteps = 100;

  struct Recorded {
    baton::v1::Mesh mesh;                 // what the steps ran on
    std::shared_ptr<const JobPlan> plan;  // its Programs and what they predict
    int first_step = 0;
    int steps = 0;
    std::vector<std::vector<baton::v1::StepTrace>> by_rank;  // [rank][step - first_step]
    // Checkpoint reads and writes of those steps' state (lane IO), by rank.
    std::vector<std::vector<baton::v1::TraceSpan>> io_by_rank;
  };

  // Arms a trace of the next `steps` steps (1 .. kMaxSteps), unless one is
  // armed or recorded and not taken: that one is kept.
  void Arm(int steps) ABSL_LOCKS_EXCLUDED(mu_);
  // The runner, starting a call at step `first`: whether its ranks record.
  bool Wants(int first) ABSL_LOCKS_EXCLUDED(mu_);
  // A call that ended well, of steps first .. on `mesh` (running `plan`'s
  // Programs): every rank's answer, by rank.
  void Collect(const baton::v1::Mesh& mesh, const std::shared_ptr<const JobPlan>& plan, int first,
               const std::vector<const baton::v1::RunStepResponse*>& by_rank) ABSL_LOCKS_EXCLUDED(mu_);
  // A save of step `step` on mesh epoch `epoch`: each rank's I/O spans (by
  // rank), kept when the step is one of those being recorded and the trace
  // is not yet taken (a save after the last recorded step's call may come
  // too late for it).
  void AddIo(int64_t epoch, int step, const std::vector<std::vector<baton::v1::TraceSpan>>& by_rank)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the armed steps are recorded, `deadline`, or `gone` says
  // why the job will not record them (polled; "" while it may); the trace,
  // which is then taken. DEADLINE_EXCEEDED / FAILED_PRECONDITION say how far
  // it got; the trace is then disarmed.
  absl::StatusOr<Recorded> Await(absl::Time deadline, const std::function<std::string()>& gone)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kIdle, kArmed, kRecorded };
  std::string Progress() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  bool taken_ ABSL_GUARDED_BY(mu_) = false;
  int wanted_ ABSL_GUARDED_BY(mu_) = 0;  // steps
  Recorded recorded_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_TRACE_H_
