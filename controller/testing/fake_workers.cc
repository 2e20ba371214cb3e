#include "controller/testing/fake_workers.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton::testing {

FakeWorker::FakeWorker(std::string name) : name_(std::move(name)) {
  grpc::ServerBuilder builder;
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  channel_ = server_->InProcessChannel(grpc::ChannelArguments());
}

FakeWorker::~FakeWorker() {
  Kill();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

void FakeWorker::set_script(const FakeScript& script) {
  absl::MutexLock lock(&mu_);
  script_ = script;
}

void FakeWorker::Kill() {
  absl::MutexLock lock(&mu_);
  alive_ = false;
  epoch_ = 0;
}

bool FakeWorker::alive() const {
  absl::MutexLock lock(&mu_);
  return alive_;
}

int FakeWorker::configures() const {
  absl::MutexLock lock(&mu_);
  return configures_;
}
int FakeWorker::steps_run() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

int FakeWorker::calls_ahead() const {
  absl::MutexLock lock(&mu_);
  return calls_ahead_;
}

int FakeWorker::step_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}
int FakeWorker::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}
int64_t FakeWorker::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}
std::string FakeWorker::job() const {
  absl::MutexLock lock(&mu_);
  return job_;
}

grpc::Status FakeWorker::Refused() const {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses (the fake was killed)");
}

grpc::Status FakeWorker::Configure(grpc::ServerContext*, const baton::v1::ConfigureRequest* req,
                                   baton::v1::ConfigureResponse* resp) {
  absl::MutexLock lock(&mu_);
  if (!alive_) return Refused();
  ++configures_;
  if (script_.configure_error != grpc::StatusCode::OK) {
    return grpc::Status(script_.configure_error, absl::StrCat(name_, ": scripted Configure failure"));
  }
  epoch_ = req->mesh().epoch();
  rank_ = req->rank();
  job_.clear();
  resp->set_rank(req->rank());
  resp->set_backend(baton::v1::GLOO);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Abort(grpc::ServerContext*, const baton::v1::AbortRequest* req, baton::v1::AbortResponse*) {
  absl::MutexLock lock(&mu_);
  if (!alive_) return Refused();
  ++aborts_;
  if (req->epoch() == 0 || req->epoch() == epoch_) {
    epoch_ = 0;
    job_.clear();
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::GetInfo(grpc::ServerContext*, const baton::v1::GetInfoRequest*,
                                 baton::v1::GetInfoResponse* resp) {
  absl::MutexLock lock(&mu_);
  if (!alive_) return Refused();
  resp->mutable_worker()->set_name(name_);
  resp->set_epoch(epoch_);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::LoadProgram(grpc::ServerContext*, const baton::v1::LoadProgramRequest* req,
                                     baton::v1::LoadProgramResponse*) {
  absl::MutexLock lock(&mu_);
  if (!alive_) return Refused();
  if (req->epoch() != epoch_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not in that mesh");
  job_ = req->program().job_id();
  next_step_ = 0;
  failed_step_ = 0;
  return grpc::Status::OK;
}

grpc::Status FakeWorker::RunStep(grpc::ServerContext* ctx, const baton::v1::RunStepRequest* req,
                                 baton::v1::RunStepResponse* resp) {
  FakeScript script;
  {
    absl::MutexLock lock(&mu_);
    if (!alive_) return Refused();
    if (req->epoch() != epoch_ || req->job_id() != job_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, absl::StrCat(name_, ": job not loaded"));
    }
    if (calls_here_ > 0) ++calls_ahead_;
    ++calls_here_;
  }
  struct Done {
    FakeWorker* w;
    bool ran = false;  // this call had the turn
    int next = 0;      // the step after its steps, once they ran
    ~Done() {
      absl::MutexLock lock(&w->mu_);
      --w->calls_here_;
      if (ran) w->running_ = false;
      if (next > 0) w->next_step_ = next;
    }
  } done{this};
  // As a worker does: a call waits for the one before it (the controller
  // sends the next call while one runs), and none runs after a failed step.
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      if (!alive_) return Refused();
      if (epoch_ != req->epoch()) return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat(name_, ": mesh aborted"));
      if (failed_step_ != 0) {
        return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat(name_, ": step ", failed_step_, " failed before"));
      }
      if (!running_ && (next_step_ == 0 || req->step() <= next_step_)) {
        running_ = true;
        done.ran = true;
        script = script_;
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  // step_delay per step; a call of K steps takes K of them.
  const absl::Time until = absl::Now() + (script.hang_steps ? absl::Seconds(30) : script.step_delay * std::max(1, req->steps()));
  while (absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
    absl::MutexLock lock(&mu_);
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (!alive_) return Refused();
    if (epoch_ != req->epoch()) return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat(name_, ": mesh aborted"));
  }
  absl::MutexLock lock(&mu_);
  resp->set_rank(rank_);
  for (int i = 0; i < std::max(1, req->steps()); ++i) {
    const int step = req->step() + i;
    if (script.fail_at_step == step && script_.fail_times != 0) {
      if (script_.fail_times > 0) --script_.fail_times;
      // As a worker does: the steps before it completed, said in the details.
      resp->set_failed_step(step);
      failed_step_ = step;
      return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(name_, ": injected failure at step ", step),
                          resp->SerializeAsString());
    }
    if (i == 0) ++calls_;
    ++steps_;
    baton::v1::StepMetrics* m = resp->add_metrics();
    m->set_step(step);
    m->set_has_loss(rank_ == 0);
    m->set_loss(10.0 / step);
    m->set_tokens(8);
    m->set_compute_ms(script.compute_ms);
  }
  done.next = req->step() + std::max(1, req->steps());
  return grpc::Status::OK;
}

grpc::Status FakeWorker::SaveShards(grpc::ServerContext*, const baton::v1::SaveShardsRequest* req,
                                    baton::v1::SaveShardsResponse*) {
  absl::MutexLock lock(&mu_);
  if (!alive_) return Refused();
  if (script_.fail_saves) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("cannot write ", req->path(), ": No space left on device"));
  }
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the fake saves nothing");
}

grpc::Status FakeWorker::RunCollectiveCheck(grpc::ServerContext*, const baton::v1::CollectiveCheckRequest* req,
                                            baton::v1::CollectiveCheckResponse* resp) {
  absl::MutexLock lock(&mu_);
  if (!alive_) return Refused();
  for (int op : req->ops()) {
    baton::v1::CollectiveResult* r = resp->add_results();
    r->set_op(static_cast<baton::v1::CollectiveOp>(op));
    r->set_passed(true);
    r->set_numel(req->numel());
  }
  return grpc::Status::OK;
}

FakeFleet::FakeFleet(int n, WorkerRegistry* registry, absl::Duration heartbeat,
                     const std::vector<std::string>& devices)
    : registry_(registry) {
  for (int i = 0; i < n; ++i) {
    workers_.push_back(std::make_unique<FakeWorker>(absl::StrCat("fake-", i)));
    incarnations_.push_back("1");
    baton::v1::WorkerInfo info;
    info.set_name(workers_.back()->name());
    info.set_address(workers_.back()->address());
    info.set_incarnation("1");
    if (i < static_cast<int>(devices.size())) info.set_compute_device(devices[i]);
    registry_->Register(info).IgnoreError();
  }
  heartbeats_ = std::thread([this, heartbeat] {
    while (!stop_.WaitForNotificationWithTimeout(heartbeat)) {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i]->alive()) registry_->Heartbeat(workers_[i]->name(), incarnations_[i]);
      }
    }
  });
}

FakeFleet::~FakeFleet() {
  stop_.Notify();
  heartbeats_.join();
}

StubFactory FakeFleet::stubs() {
  return [this](const std::string& address) -> std::shared_ptr<WorkerStub> {
    absl::MutexLock lock(&mu_);
    for (auto& w : workers_) {
      if (w->address() == address) return baton::v1::Worker::NewStub(w->channel());
    }
    return baton::v1::Worker::NewStub(grpc::CreateChannel("unix:/nonexistent", grpc::InsecureChannelCredentials()));
  };
}

}  // namespace baton::testing
