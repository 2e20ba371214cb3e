// In-process fake workers for the controller's unit tests: each is a real
// baton.v1.Worker service behind an in-process channel (no port, no daemon),
// registered with a WorkerRegistry as "fake-N" at "fake-N:1", heartbeating
// until it is killed. What it answers is scripted per worker; what it was
// asked is counted.
//
// Thread-safe.
#ifndef BATON_CONTROLLER_TESTING_FAKE_WORKERS_H_
#define BATON_CONTROLLER_TESTING_FAKE_WORKERS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "controller/dispatcher.h"
#include "controller/worker_registry.h"
#include "proto/worker.grpc.pb.h"

namespace baton::testing {

struct FakeScript {
  absl::Duration step_delay = absl::ZeroDuration();  // each RunStep takes this long
  int fail_at_step = 0;  // RunStep of this step fails (INTERNAL), 0 = never
  int fail_times = -1;   // ... this many times (-1: every time)
  bool hang_steps = false;  // RunStep waits until its mesh is aborted (or cancelled)
  grpc::StatusCode configure_error = grpc::StatusCode::OK;  // Configure fails with it
  bool fail_saves = false;  // SaveShards fails as a full disk would
  double compute_ms = 0;    // each step's StepMetrics.compute_ms
};

class FakeWorker final : public baton::v1::Worker::Service {
 public:
  explicit FakeWorker(std::string name);
  ~FakeWorker() override;

  const std::string& name() const { return name_; }
  std::string address() const { return name_ + ":1"; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  void set_script(const FakeScript& script) ABSL_LOCKS_EXCLUDED(mu_);
  // Killed: every call fails as a refused connection does, no heartbeats.
  void Kill() ABSL_LOCKS_EXCLUDED(mu_);
  bool alive() const ABSL_LOCKS_EXCLUDED(mu_);

  int configures() const ABSL_LOCKS_EXCLUDED(mu_);
  int steps_run() const ABSL_LOCKS_EXCLUDED(mu_);  // steps run (a RunStep may run several)
  int step_calls() const ABSL_LOCKS_EXCLUDED(mu_);  // RunStep calls that ran their steps
  // RunStep calls that arrived while another one ran (sent ahead of it).
  int calls_ahead() const ABSL_LOCKS_EXCLUDED(mu_);
  int aborts() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);  // its current mesh, 0 = none
  std::string job() const ABSL_LOCKS_EXCLUDED(mu_);  // the job loaded

  grpc::Status Configure(grpc::ServerContext*, const baton::v1::ConfigureRequest* req,
                         baton::v1::ConfigureResponse* resp) override;
  grpc::Status Abort(grpc::ServerContext*, const baton::v1::AbortRequest* req, baton::v1::AbortResponse*) override;
  grpc::Status GetInfo(grpc::ServerContext*, const baton::v1::GetInfoRequest*, baton::v1::GetInfoResponse* resp) override;
  grpc::Status LoadProgram(grpc::ServerContext*, const baton::v1::LoadProgramRequest* req,
                           baton::v1::LoadProgramResponse*) override;
  grpc::Status RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest* req,
                       baton::v1::RunStepResponse* resp) override;
  grpc::Status SaveShards(grpc::ServerContext*, const baton::v1::SaveShardsRequest* req,
                          baton::v1::SaveShardsResponse*) override;
  grpc::Status RunCollectiveCheck(grpc::ServerContext*, const baton::v1::CollectiveCheckRequest* req,
                                  baton::v1::CollectiveCheckResponse* resp) override;

 private:
  grpc::Status Refused() const;
  const std::string name_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  mutable absl::Mutex mu_;
  FakeScript script_ ABSL_GUARDED_BY(mu_);
  bool alive_ ABSL_GUARDED_BY(mu_) = true;
  int configures_ ABSL_GUARDED_BY(mu_) = 0;
  int steps_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int rank_ ABSL_GUARDED_BY(mu_) = 0;
  std::string job_ ABSL_GUARDED_BY(mu_);
  int calls_ahead_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_here_ ABSL_GUARDED_BY(mu_) = 0;  // RunSteps arrived and not answered
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a RunStep runs its steps
  int next_step_ ABSL_GUARDED_BY(mu_) = 0;     // after the last call; 0: any
  int failed_step_ ABSL_GUARDED_BY(mu_) = 0;   // 0: none failed
};

// `n` fake workers registered with `registry`, heartbeating every
// `heartbeat` while alive.
class FakeFleet {
 public:
  // `devices[i]`: what worker i says it computes on (WorkerInfo.compute_device;
  // none: says nothing, a CPU worker).
  FakeFleet(int n, WorkerRegistry* registry, absl::Duration heartbeat = absl::Milliseconds(50),
            const std::vector<std::string>& devices = {});
  ~FakeFleet();

  FakeWorker& worker(int i) { return *workers_[i]; }
  int size() const { return static_cast<int>(workers_.size()); }
  // Stubs over the fakes' in-process channels, by address.
  StubFactory stubs();

 private:
  WorkerRegistry* const registry_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::vector<std::string> incarnations_;
  absl::Mutex mu_;  // guards workers_ against Restart while heartbeating
  absl::Notification stop_;
  std::thread heartbeats_;
};

}  // namespace baton::testing

#endif  // BATON_CONTROLLER_TESTING_FAKE_WORKERS_H_
