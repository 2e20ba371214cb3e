// baton::Client — the C++ SDK a job script uses to drive a Baton controller.
//
//   auto client = baton::Client::Connect("127.0.0.1:7000");
//   auto mesh = (*client)->CreateMesh("dp=2,tp=2");
//   auto check = (*client)->CheckCollectives(request);
//
// Every call carries a deadline. Not thread-safe per instance (the stub is,
// but keep one Client per thread for clarity).
#ifndef BATON_CLIENT_CLIENT_H_
#define BATON_CLIENT_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/controller.grpc.pb.h"

namespace baton {

// "dp=2,tp=2" -> MeshSpec, validated (same rules as DeviceMesh).
absl::StatusOr<baton::v1::MeshSpec> ParseMeshSpecProto(const std::string& text);

class Client {
 public:
  // Deadline of quick calls (Status, CreateMesh uses the rendezvous time too).
  static constexpr absl::Duration kCallDeadline = absl::Seconds(10);

  // Connects and waits up to `timeout` for the controller to answer. Calls
  // carry the client token and TLS settings of the environment
  // (BATON_TOKEN_FILE or BATON_TOKEN; BATON_TLS_CA/CERT/KEY), or `credentials`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         absl::Duration timeout = absl::Seconds(5));
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address, absl::Duration timeout,
                                                         const Credentials& credentials);

  absl::StatusOr<baton::v1::StatusResponse> Status();
  // `backend` unspecified: the controller's --default_backend.
  absl::StatusOr<baton::v1::Mesh> CreateMesh(const std::string& spec,
                                             baton::v1::CommBackend backend = baton::v1::COMM_BACKEND_UNSPECIFIED,
                                             absl::Duration deadline = absl::Seconds(60));
  absl::StatusOr<baton::v1::CheckCollectivesResponse> CheckCollectives(
      const baton::v1::CheckCollectivesRequest& request,
      absl::Duration deadline = absl::Minutes(10));
  absl::StatusOr<baton::v1::CreateJobResponse> CreateJob(const baton::v1::CreateJobRequest& request,
                                                        absl::Duration deadline = absl::Minutes(2));
  absl::StatusOr<baton::v1::StepResponse> Step(const baton::v1::StepRequest& request,
                                               absl::Duration deadline = absl::Minutes(30));
  // Step, answered as it goes: `on_part` for each message (the steps that
  // settled, in order) until it returns false (the call is cancelled: the
  // steps running complete on their own), the steps asked have run, or the
  // job ended or failed (its status).
  absl::Status StepStream(const baton::v1::StepRequest& request,
                          const std::function<bool(const baton::v1::StepResponse&)>& on_part,
                          absl::Duration deadline = absl::InfiniteDuration());
  // A detached job: validated and queued; the controller runs it to its
  // last step with no client attached. Returns once it is queued.
  absl::StatusOr<baton::v1::CreateJobResponse> Submit(const baton::v1::CreateJobRequest& request,
                                                      absl::Duration deadline = absl::Minutes(2));
  // Every job the controller knows, or (job_id) one of them.
  absl::StatusOr<std::vector<baton::v1::JobStatus>> Jobs(const std::string& job_id = "");
  absl::StatusOr<baton::v1::JobStatus> GetJob(const std::string& job_id);
  // A job's log from `after_sequence`: `on_entry` for each entry until it
  // returns false, the log ends (with `follow`: once the job has ended) or
  // `duration` passed.
  absl::Status Logs(const std::string& job_id, int64_t after_sequence, bool follow,
                    const std::function<bool(const baton::v1::JobLogEntry&)>& on_entry,
                    absl::Duration duration = absl::InfiniteDuration());
  // Renews an attached job's lease without stepping it.
  absl::StatusOr<baton::v1::JobStatus> KeepAlive(const std::string& job_id);
  absl::StatusOr<baton::v1::StopJobResponse> StopJob(const std::string& job_id,
                                                     absl::Duration deadline = absl::Seconds(20));
  // Moves a running job onto `mesh` ("dp=4": its axes resized) at its next
  // step boundary, worker to worker; with `wait` > 0, until it runs there
  // (the status then, whose `restored` says what moved).
  absl::StatusOr<baton::v1::JobStatus> RescaleJob(const std::string& job_id, const std::string& mesh,
                                                  absl::Duration wait = absl::ZeroDuration());
  // Saves the job at its current step under DIR/step-N ("" = the job's
  // checkpoint.dir); async returns once the workers copied their pieces.
  absl::StatusOr<baton::v1::SaveCheckpointResponse> SaveCheckpoint(const std::string& job_id, const std::string& dir,
                                                                   bool async,
                                                                   absl::Duration deadline = absl::Minutes(15));
  // Waits until the job's async save (if any) is published.
  absl::StatusOr<baton::v1::SaveCheckpointResponse> WaitCheckpoint(const std::string& job_id,
                                                                   absl::Duration deadline = absl::Minutes(15));
  // Records the job's next `steps` steps on every rank (a detached job
  // steps by itself meanwhile) and answers them as Chrome trace JSON, on
  // the controller's clock. `start_only`: arms the trace and answers at
  // once (an attached job's client then runs the steps and asks again).
  absl::StatusOr<baton::v1::TraceJobResponse> TraceJob(const std::string& job_id, int steps, bool start_only = false,
                                                       absl::Duration timeout = absl::Minutes(2));
  // Streams events to `on_event` until it returns false or `duration` passed.
  absl::Status Watch(int64_t after_sequence, const std::function<bool(const baton::v1::Event&)>& on_event,
                     absl::Duration duration);

  // Waits until at least `n` workers are registered and alive.
  absl::Status WaitForWorkers(int n, absl::Duration timeout);

  const std::string& address() const { return address_; }

 private:
  Client(std::string address, std::unique_ptr<baton::v1::Controller::Stub> stub)
      : address_(std::move(address)), stub_(std::move(stub)) {}

  std::string address_;
  std::unique_ptr<baton::v1::Controller::Stub> stub_;
};

}  // namespace baton

#endif  // BATON_CLIENT_CLIENT_H_
