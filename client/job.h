// baton::Job — a training job as a job script drives it: one handle over
// the controller's job RPCs, so that one C++ program can train with one
// plan, save, and go on with another plan on another mesh.
//
//   auto job = baton::Job::Create(client.get(), fsdp_spec);
//   auto metrics = (*job)->Step(4);               // steps 1..4
//   (*job)->Save("ckpt/run");                      // ckpt/run/step-00000004
//   (*job)->Stop();
//   auto tp = baton::Job::Restore(client.get(), dp2_tp2_spec, "ckpt/run");
//   (*tp)->Step(4);                                // steps 5..8, resharded
//
// The handle holds its job: destroying it stops the job and frees its
// workers (as a lapsed lease would, only at once).
//
// A call that loses the controller midway (it was killed and restarted)
// says what became of the job: its next call is answered "FAILED: the
// controller restarted ...".
//
// Not thread-safe; the Client must outlive it.
#ifndef BATON_CLIENT_JOB_H_
#define BATON_CLIENT_JOB_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "proto/controller.pb.h"
#include "proto/job.pb.h"

namespace baton {

class Job {
 public:
  // Creates the job on free workers of the fleet (validated, planned and
  // loaded); an attached job: this handle holds its lease, which every call
  // renews (`lease` zero: the controller's default, 10 s). `backend`
  // unspecified: the controller's --default_backend.
  static absl::StatusOr<std::unique_ptr<Job>> Create(
      Client* client, const baton::v1::JobSpec& spec,
      baton::v1::CommBackend backend = baton::v1::COMM_BACKEND_UNSPECIFIED,
      absl::Duration lease = absl::ZeroDuration());
  // A new job from `spec` (its mesh and plan) resuming the checkpoint in
  // `dir` (a checkpoint, or a directory of step-N ones: the newest):
  // parameters, optimizer state, step and data position, resharded.
  static absl::StatusOr<std::unique_ptr<Job>> Restore(
      Client* client, baton::v1::JobSpec spec, const std::string& dir,
      baton::v1::CommBackend backend = baton::v1::COMM_BACKEND_UNSPECIFIED);

  // Runs the next `n` steps (fewer if the job ends); their metrics. With
  // `steps_per_call` K > 1 the workers run up to K of them per round trip
  // (periodic checkpoints still fall on their steps); 0 leaves K to the
  // controller (a second's worth per call, as for a detached job).
  absl::StatusOr<std::vector<baton::v1::StepMetrics>> Step(int n = 1, int steps_per_call = 1);
  // Runs the next `n` steps as Step does, recording them on every rank: one
  // span per Program instruction, each collective in flight, on the
  // controller's clock (TraceJobResponse.trace_json: Chrome trace-event
  // JSON, which Perfetto opens). The job goes on as untraced.
  absl::StatusOr<baton::v1::TraceJobResponse> Trace(int n = 10, int steps_per_call = 1);
  // Saves at the current step under DIR/step-N; returns where. Async: the
  // save goes on while Step runs; WaitForSave publishes it.
  absl::StatusOr<baton::v1::CheckpointInfo> Save(const std::string& dir, bool async = false);
  absl::StatusOr<baton::v1::CheckpointInfo> WaitForSave();
  absl::Status Stop();
  ~Job();
  // Renews the lease while the script does something else for a while.
  absl::Status KeepAlive();

  const std::string& id() const { return id_; }
  int step() const { return status_.step(); }
  const baton::v1::JobStatus& status() const { return status_; }
  const baton::v1::CreateJobResponse& created() const { return created_; }

  // When `s` is a call that lost the controller (not the job's own failure),
  // asks the controller - once it answers again, within `wait` - what became
  // of job `job_id`, and says so; else `s` itself.
  static absl::Status ExplainLostCall(Client* client, const std::string& job_id, const absl::Status& s,
                                      absl::Duration wait = absl::Seconds(20));
  // Every step this handle ran, in order.
  const std::vector<baton::v1::StepMetrics>& metrics() const { return metrics_; }

 private:
  Job(Client* client, baton::v1::CreateJobResponse created)
      : client_(client), created_(std::move(created)), id_(created_.job().job_id()), status_(created_.job()) {}

  Client* client_;
  baton::v1::CreateJobResponse created_;
  std::string id_;
  baton::v1::JobStatus status_;
  std::vector<baton::v1::StepMetrics> metrics_;
  bool stopped_ = false;
};

}  // namespace baton

#endif  // BATON_CLIENT_JOB_H_
