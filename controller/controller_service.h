// baton.v1.Controller: what clients call. The service only authenticates,
// checks what can be checked of a request on its own (ids, bounds), routes
// it to the manager that owns the concern and converts the answer:
//
//   fleet and meshes ── MeshManager (free workers, disjoint meshes, epochs)
//   collective checks ── RunFleetCheck (a mesh of free workers beside jobs)
//   jobs ────────────── JobManager (table, queue, runners, leases, store)
//   events ──────────── EventLog (typed; Watch streams them)
//
// Watch and JobLogs are served by gRPC's callback API (a reactor per
// stream, no thread held while it waits); every other method is
// synchronous and returns by its deadline. Thread-safe: the service holds
// no state of its own but the HTTP address and the stream counts.
#ifndef BATON_CONTROLLER_CONTROLLER_SERVICE_H_
#define BATON_CONTROLLER_CONTROLLER_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/security.h"
#include "controller/event_log.h"
#include "controller/job_manager.h"
#include "common/text.h"
#include "controller/mesh_manager.h"
#include "controller/trace_call.h"
#include "controller/worker_registry.h"
#include "proto/controller.grpc.pb.h"

namespace baton {

// Ids a client sends: CheckJobId (common/text.h).

using ControllerBase = baton::v1::Controller::WithCallbackMethod_Watch<
    baton::v1::Controller::WithCallbackMethod_JobLogs<baton::v1::Controller::Service>>;

class ControllerService final : public ControllerBase {
 public:
  // Streams cost no thread, only memory: a bounded number, each starting
  // with at most kStreamHistory past entries.
  static constexpr int kMaxStreams = 256;
  static constexpr size_t kStreamHistory = 1000;
  // For the status page: the steps of the newest jobs, and events.
  static constexpr size_t kHistoryJobs = 8;
  static constexpr size_t kHistorySteps = 1000;
  static constexpr size_t kPageEvents = 50;

  ControllerService(WorkerRegistry* registry, MeshManager* meshes, JobManager* jobs, EventLog* events,
                    Authenticator auth);

  grpc::Status Status(grpc::ServerContext*, const baton::v1::StatusRequest* req,
                      baton::v1::StatusResponse* resp) override;
  grpc::Status CreateMesh(grpc::ServerContext*, const baton::v1::CreateMeshRequest* req,
                          baton::v1::CreateMeshResponse* resp) override;
  grpc::Status CheckCollectives(grpc::ServerContext*, const baton::v1::CheckCollectivesRequest* req,
                                baton::v1::CheckCollectivesResponse* resp) override;
  grpc::ServerWriteReactor<baton::v1::Event>* Watch(grpc::CallbackServerContext* ctx,
                                                     const baton::v1::WatchRequest* req) override;
  grpc::Status CreateJob(grpc::ServerContext*, const baton::v1::CreateJobRequest* req,
                         baton::v1::CreateJobResponse* resp) override;
  grpc::Status SubmitJob(grpc::ServerContext*, const baton::v1::CreateJobRequest* req,
                         baton::v1::CreateJobResponse* resp) override;
  grpc::Status Step(grpc::ServerContext*, const baton::v1::StepRequest* req, baton::v1::StepResponse* resp) override;
  grpc::Status StepStream(grpc::ServerContext*, const baton::v1::StepRequest* req,
                          grpc::ServerWriter<baton::v1::StepResponse>* writer) override;
  grpc::Status KeepAlive(grpc::ServerContext*, const baton::v1::KeepAliveRequest* req,
                         baton::v1::KeepAliveResponse* resp) override;
  grpc::Status ListJobs(grpc::ServerContext*, const baton::v1::ListJobsRequest* req,
                        baton::v1::ListJobsResponse* resp) override;
  grpc::ServerWriteReactor<baton::v1::JobLogEntry>* JobLogs(grpc::CallbackServerContext* ctx,
                                                            const baton::v1::JobLogsRequest* req) override;
  grpc::Status StopJob(grpc::ServerContext*, const baton::v1::StopJobRequest* req,
                       baton::v1::StopJobResponse* resp) override;
  grpc::Status RescaleJob(grpc::ServerContext*, const baton::v1::RescaleJobRequest* req,
                          baton::v1::RescaleJobResponse* resp) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext*, const baton::v1::SaveCheckpointRequest* req,
                              baton::v1::SaveCheckpointResponse* resp) override;
  grpc::Status WaitCheckpoint(grpc::ServerContext*, const baton::v1::WaitCheckpointRequest* req,
                              baton::v1::SaveCheckpointResponse* resp) override;
  grpc::Status TraceJob(grpc::ServerContext*, const baton::v1::TraceJobRequest* req,
                        baton::v1::TraceJobResponse* resp) override;

  // What Status returns; with the newest jobs' steps and recent events for
  // the status page when `with_history`.
  baton::v1::StatusResponse Snapshot(bool with_history) const;
  // Where /metrics and the status page are served (for Status).
  void set_http_address(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // The newest trace TraceJob wrote (the status page hands it out).
  const NewestTrace& newest_trace() const { return newest_trace_; }

 private:
  // Takes a stream slot, or RESOURCE_EXHAUSTED when none is left.
  grpc::Status EnterStream();
  // The job `id` names (after CheckJobId), or why not.
  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& id) const;

  WorkerRegistry* const registry_;
  MeshManager* const meshes_;
  JobManager* const jobs_;
  EventLog* const events_;
  const Authenticator auth_;
  std::atomic<int> streams_{0};
  std::atomic<int64_t> checks_{0};
  NewestTrace newest_trace_;
  mutable absl::Mutex mu_;
  std::string http_address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_CONTROLLER_SERVICE_H_
