#include "controller/controller_service.h"

#include <malloc.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/collective_ops.h"
#include "common/wire.h"

namespace baton {
namespace {

using baton::v1::CollectiveOp;

constexpr int64_t kDefaultCheckNumel = 1 << 20;
constexpr int kDefaultCheckIters = 3;
constexpr int kMaxCheckIters = 100;
constexpr int64_t kDefaultCheckTimeoutMs = 5000;

grpc::Status Error(grpc::StatusCode code, const std::string& msg) { return grpc::Status(code, msg); }

}  // namespace

std::string WorkerLabel(const baton::v1::Mesh& mesh, int rank) {
  return absl::StrCat("worker ", mesh.worker_names(rank), " (rank ", rank, ", ", mesh.worker_addresses(rank), ")");
}

ControllerService::ControllerService(WorkerRegistry* registry, KeyValueStore* kv, EventLog* events,
                                     ControllerOptions options)
    : registry_(registry), kv_(kv), events_(events), options_(options), dispatcher_(options.worker_credentials) {}

ControllerService::~ControllerService() { Stop(); }

void ControllerService::Start() { monitor_ = std::thread([this] { MonitorLoop(); }); }

void ControllerService::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (monitor_.joinable()) monitor_.join();
  FinishInFlightSave();
}

void ControllerService::MonitorLoop() {
  absl::Time last_trim = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(options_.sweep_interval)) {
    // What a burst of calls (a flood of streams or values) left in the
    // allocator's arenas goes back to the system: the controller's memory
    // follows what it holds, not its high mark.
    if (absl::Now() - last_trim > kTrimInterval) {
      malloc_trim(0);
      last_trim = absl::Now();
    }
    std::vector<std::string> dead = registry_->SweepDead();
    if (dead.empty()) continue;
    baton::v1::Mesh mesh;
    {
      absl::MutexLock lock(&mu_);
      mesh = current_;
    }
    if (mesh.epoch() == 0) continue;
    for (const auto& name : dead) {
      auto it = std::find(mesh.worker_names().begin(), mesh.worker_names().end(), name);
      if (it == mesh.worker_names().end()) continue;
      int rank = static_cast<int>(it - mesh.worker_names().begin());
      AbortMesh(mesh, absl::StrCat(WorkerLabel(mesh, rank), " is DEAD (missed heartbeats)"));
      break;
    }
  }
}

std::string ControllerService::DeadWorkerIn(const baton::v1::Mesh& mesh) const {
  const std::vector<size_t> dead = DeadRanksIn(mesh);
  if (dead.empty()) return "";
  const int r = static_cast<int>(dead.front());
  auto info = registry_->Get(mesh.worker_names(r));
  return absl::StrFormat("%s is DEAD: no heartbeat for %.1f s", WorkerLabel(mesh, r),
                         info.ok() ? info->heartbeat_age_s() : 0.0);
}

std::vector<size_t> ControllerService::DeadRanksIn(const baton::v1::Mesh& mesh) const {
  std::vector<size_t> dead;
  for (int r = 0; r < mesh.worker_names_size(); ++r) {
    auto info = registry_->Get(mesh.worker_names(r));
    if (!info.ok() || info->state() == baton::v1::DEAD) dead.push_back(static_cast<size_t>(r));
  }
  return dead;
}

std::string ControllerService::ExplainFailure(const baton::v1::Mesh& mesh,
                                              const std::vector<grpc::Status>& statuses) {
  // A dead worker explains everything else; then one that does not answer
  // now (a crashed worker refuses connections at once, while the survivors
  // only report that a collective failed); then whatever a worker reported.
  std::string dead = DeadWorkerIn(mesh);
  if (!dead.empty()) return dead;
  std::vector<std::string> addresses(mesh.worker_addresses().begin(), mesh.worker_addresses().end());
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*,
                             const baton::v1::GetInfoRequest&, baton::v1::GetInfoResponse*)>
      probe = [](auto* stub, auto* ctx, const auto& req, auto* resp) { return stub->GetInfo(ctx, req, resp); };
  auto probes = dispatcher_.Call<baton::v1::GetInfoRequest, baton::v1::GetInfoResponse>(
      addresses, probe, [](size_t) { return baton::v1::GetInfoRequest(); }, kProbeDeadline, nullptr,
      nullptr);
  for (size_t r = 0; r < probes.size(); ++r) {
    if (probes[r].status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::StrCat(WorkerLabel(mesh, static_cast<int>(r)), " is unreachable (",
                          probes[r].status.error_message(), ")");
    }
  }
  std::vector<std::string> other;
  for (size_t r = 0; r < statuses.size(); ++r) {
    const grpc::Status& s = statuses[r];
    // Calls we cancelled after another failed explain nothing.
    if (s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) continue;
    other.push_back(absl::StrCat(WorkerLabel(mesh, static_cast<int>(r)), ": ", s.error_message()));
  }
  if (!other.empty()) {
    return absl::StrCat(other.front(),
                        other.size() > 1 ? absl::StrCat(" (and ", other.size() - 1, " more)") : "");
  }
  return "unknown failure";
}

void ControllerService::AbortMesh(const baton::v1::Mesh& mesh, const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (current_.epoch() == mesh.epoch()) {
      current_ = baton::v1::Mesh();
      current_incarnations_.clear();
    }
  }
  kv_->AbortPrefix(absl::StrCat("mesh/", mesh.epoch(), "/"), reason);
  events_->Append("mesh_aborted", "", -1, absl::StrCat(mesh.mesh_id(), ": ", reason));
  std::vector<std::string> live;
  std::vector<std::string> names;
  for (int r = 0; r < mesh.worker_names_size(); ++r) {
    auto info = registry_->Get(mesh.worker_names(r));
    if (info.ok() && info->state() != baton::v1::DEAD) {
      live.push_back(mesh.worker_addresses(r));
      names.push_back(mesh.worker_names(r));
    }
  }
  registry_->SetState(names, baton::v1::REGISTERED);
  FailJob(mesh, reason);
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*,
                             const baton::v1::AbortRequest&, baton::v1::AbortResponse*)>
      abort = [](auto* stub, auto* ctx, const auto& req, auto* resp) {
        return stub->Abort(ctx, req, resp);
      };
  baton::v1::AbortRequest req;
  req.set_epoch(mesh.epoch());
  req.set_reason(reason);
  dispatcher_.Call<baton::v1::AbortRequest, baton::v1::AbortResponse>(
      live, abort, [&](size_t) { return req; }, absl::Seconds(2), nullptr, nullptr);
}

absl::StatusOr<baton::v1::Mesh> ControllerService::EnsureMesh(const baton::v1::MeshSpec& spec,
                                                              baton::v1::CommBackend backend) {
  std::vector<MeshAxisSpec> axes = ToMeshAxes(spec.axes());
  auto device_mesh = DeviceMesh::Create(axes);
  if (!device_mesh.ok()) return device_mesh.status();
  if (backend == baton::v1::COMM_BACKEND_UNSPECIFIED) backend = options_.default_backend;
  {
    absl::MutexLock lock(&mu_);
    bool same = current_.epoch() != 0 && current_backend_ == backend &&
                FormatMeshSpec(ToMeshAxes(current_.axes())) == FormatMeshSpec(axes);
    for (int r = 0; same && r < current_.worker_names_size(); ++r) {
      auto info = registry_->Get(current_.worker_names(r));
      same = info.ok() && info->state() != baton::v1::DEAD &&
             info->incarnation() == current_incarnations_[r];
    }
    if (same) return current_;
  }
  // Pick the first live workers in fleet order.
  const int need = device_mesh->size();
  std::vector<baton::v1::WorkerInfo> fleet = registry_->List();
  std::vector<baton::v1::WorkerInfo> chosen;
  std::vector<std::string> dead;
  for (const auto& w : fleet) {
    if (w.state() == baton::v1::DEAD) {
      dead.push_back(absl::StrFormat("worker %s (rank %d) is DEAD, last heartbeat %.1f s ago",
                                     w.name(), w.rank(), w.heartbeat_age_s()));
    } else if (static_cast<int>(chosen.size()) < need) {
      chosen.push_back(w);
    }
  }
  if (static_cast<int>(chosen.size()) < need) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh ", FormatMeshSpec(axes), " needs ", need, " workers but only ", chosen.size(),
        " of ", fleet.size(), " registered are alive",
        dead.empty() ? "" : absl::StrCat(": ", absl::StrJoin(dead, "; ")),
        "; start more workers or ask for a smaller mesh"));
  }
  baton::v1::Mesh mesh;
  std::vector<std::string> incarnations;
  baton::v1::Mesh previous;
  {
    absl::MutexLock lock(&mu_);
    mesh.set_epoch(next_epoch_++);
    previous = current_;
  }
  // Workers of the old mesh that the new one leaves out must drop it too.
  if (previous.epoch() != 0) AbortMesh(previous, absl::StrCat("replaced by ", FormatMeshSpec(axes)));
  mesh.set_mesh_id(absl::StrCat("mesh-", mesh.epoch()));
  *mesh.mutable_axes() = spec.axes();
  std::vector<std::string> addresses, names;
  for (const auto& w : chosen) {
    mesh.add_worker_names(w.name());
    mesh.add_worker_addresses(w.address());
    addresses.push_back(w.address());
    names.push_back(w.name());
    incarnations.push_back(w.incarnation());
  }
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*,
                             const baton::v1::ConfigureRequest&, baton::v1::ConfigureResponse*)>
      configure = [](auto* stub, auto* ctx, const auto& req, auto* resp) {
        return stub->Configure(ctx, req, resp);
      };
  std::string abort_reason;
  auto results = dispatcher_.Call<baton::v1::ConfigureRequest, baton::v1::ConfigureResponse>(
      addresses, configure,
      [&](size_t r) {
        baton::v1::ConfigureRequest req;
        *req.mutable_mesh() = mesh;
        req.set_rank(static_cast<int>(r));
        req.set_backend(backend);
        req.set_timeout_ms(absl::ToInt64Milliseconds(options_.rendezvous_timeout));
        return req;
      },
      options_.rendezvous_timeout + options_.rpc_slack,
      [&]() -> std::string {
        // A rank that failed already dooms the rendezvous: release the others.
        std::string dead_worker = DeadWorkerIn(mesh);
        if (!dead_worker.empty()) kv_->AbortPrefix(absl::StrCat("mesh/", mesh.epoch(), "/"), dead_worker);
        return dead_worker;
      },
      &abort_reason);
  if (const std::string why = AbortOnFailure(mesh, results, abort_reason); !why.empty()) {
    return absl::UnavailableError(
        absl::StrCat("forming mesh ", FormatMeshSpec(axes), " failed: ", why));
  }
  registry_->SetState(names, baton::v1::CONFIGURED);
  {
    absl::MutexLock lock(&mu_);
    current_ = mesh;
    current_incarnations_ = incarnations;
    current_backend_ = backend;
  }
  events_->Append("mesh_created", "", -1,
                  absl::StrCat(mesh.mesh_id(), " ", FormatMeshSpec(axes), " on [",
                               absl::StrJoin(names, ", "), "]"));
  return mesh;
}

grpc::Status ControllerService::Status(grpc::ServerContext* ctx, const baton::v1::StatusRequest* req,
                                       baton::v1::StatusResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  *resp = Snapshot(req->with_history());
  return grpc::Status::OK;
}

baton::v1::StatusResponse ControllerService::Snapshot(bool with_history) const {
  baton::v1::StatusResponse resp;
  for (auto& w : registry_->List()) *resp.add_workers() = std::move(w);
  if (with_history) {
    for (auto& e : events_->After(0, absl::ZeroDuration(), kPageEvents)) *resp.add_events() = std::move(e);
  }
  absl::MutexLock lock(&mu_);
  if (current_.epoch() != 0) *resp.mutable_mesh() = current_;
  resp.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(registry_->heartbeat_timeout()));
  if (!job_.status.job_id().empty()) *resp.mutable_job() = job_.status;
  if (with_history) {
    for (const auto& m : history_) *resp.add_history() = m;
  }
  resp.set_http_address(http_address_);
  return resp;
}

std::string ControllerService::ActiveJob() const {
  absl::MutexLock lock(&mu_);
  if (job_.status.job_id().empty() || job_.status.state() == baton::v1::JOB_FINISHED ||
      job_.status.state() == baton::v1::JOB_STOPPED || job_.status.state() == baton::v1::JOB_FAILED) {
    return "";
  }
  return job_.status.job_id();
}

grpc::Status ControllerService::CreateMesh(grpc::ServerContext* ctx,
                                           const baton::v1::CreateMeshRequest* req,
                                           baton::v1::CreateMeshResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  absl::MutexLock op(&op_mu_);
  if (const std::string job = ActiveJob(); !job.empty()) {
    return Error(grpc::StatusCode::FAILED_PRECONDITION,
                 absl::StrCat("job ", job, " is using the fleet; stop it (StopJob) before forming a mesh"));
  }
  auto mesh = EnsureMesh(req->spec(), req->backend());
  if (!mesh.ok()) return ToGrpcStatus(mesh.status());
  *resp->mutable_mesh() = *mesh;
  return grpc::Status::OK;
}

grpc::Status ControllerService::CheckCollectives(grpc::ServerContext* ctx,
                                                 const baton::v1::CheckCollectivesRequest* req,
                                                 baton::v1::CheckCollectivesResponse* resp) {
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return denied;
  // Validate everything before touching a worker.
  auto device_mesh = DeviceMesh::Create(ToMeshAxes(req->spec().axes()));
  if (!device_mesh.ok()) return ToGrpcStatus(device_mesh.status());
  const int64_t numel = req->numel() == 0 ? kDefaultCheckNumel : req->numel();
  const int iters = req->iters() == 0 ? kDefaultCheckIters : req->iters();
  const int64_t timeout_ms = req->timeout_ms() == 0 ? kDefaultCheckTimeoutMs : req->timeout_ms();
  if (numel < 0 || numel > kMaxCheckNumel) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("numel ", numel, " outside [1, ", kMaxCheckNumel, "]"));
  }
  if (iters < 1 || iters > kMaxCheckIters) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("iters ", iters, " outside [1, ", kMaxCheckIters, "]"));
  }
  if (timeout_ms < 1 || timeout_ms > kMaxCheckTimeoutMs) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("timeout_ms ", timeout_ms, " outside [1, ", kMaxCheckTimeoutMs, "]"));
  }
  std::vector<std::string> axes(req->axes().begin(), req->axes().end());
  if (axes.empty()) axes = device_mesh->axis_names();
  for (const auto& a : axes) {
    if (a == "world") continue;
    if (auto s = device_mesh->AxisIndex(a); !s.ok()) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.status().message()));
    }
  }
  std::vector<CollectiveOp> ops;
  for (int op : req->ops()) {
    if (!baton::v1::CollectiveOp_IsValid(op) || op == baton::v1::COLLECTIVE_OP_UNSPECIFIED) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("unknown collective op ", op));
    }
    ops.push_back(static_cast<CollectiveOp>(op));
  }
  if (ops.empty()) ops = AllCollectiveOps();

  absl::MutexLock op(&op_mu_);
  if (const std::string job = ActiveJob(); !job.empty()) {
    return Error(grpc::StatusCode::FAILED_PRECONDITION,
                 absl::StrCat("job ", job, " is using the fleet; stop it (StopJob) before checking collectives"));
  }
  auto formed = EnsureMesh(req->spec(), req->backend());
  if (!formed.ok()) return ToGrpcStatus(formed.status());
  const baton::v1::Mesh mesh = *formed;
  *resp->mutable_mesh() = mesh;
  std::vector<std::string> addresses(mesh.worker_addresses().begin(), mesh.worker_addresses().end());
  std::vector<std::string> names(mesh.worker_names().begin(), mesh.worker_names().end());
  registry_->SetState(names, baton::v1::RUNNING);
  std::function<grpc::Status(baton::v1::Worker::Stub*, grpc::ClientContext*,
                             const baton::v1::CollectiveCheckRequest&,
                             baton::v1::CollectiveCheckResponse*)>
      run = [](auto* stub, auto* ctx, const auto& r, auto* out) {
        return stub->RunCollectiveCheck(ctx, r, out);
      };
  bool passed = true;
  for (const std::string& axis : axes) {
    baton::v1::CollectiveCheckRequest creq;
    creq.set_epoch(mesh.epoch());
    creq.set_axis(axis);
    for (CollectiveOp o : ops) creq.add_ops(o);
    creq.set_numel(numel);
    creq.set_iters(iters);
    creq.set_timeout_ms(timeout_ms);
    const absl::Duration deadline =
        absl::Milliseconds(timeout_ms) * static_cast<double>(ops.size() * iters + 1) + options_.rpc_slack;
    std::string abort_reason;
    auto results = dispatcher_.Call<baton::v1::CollectiveCheckRequest, baton::v1::CollectiveCheckResponse>(
        addresses, run, [&](size_t) { return creq; }, deadline,
        [&] { return DeadWorkerIn(mesh); }, &abort_reason);
    const std::string why = AbortOnFailure<baton::v1::CollectiveCheckResponse>(
        mesh, results, abort_reason, [&](const baton::v1::CollectiveCheckResponse& r) {
          return r.results_size() == static_cast<int>(ops.size());
        });
    if (!why.empty()) {
      events_->Append("check_failed", "", -1, why);
      return Error(grpc::StatusCode::UNAVAILABLE,
                   absl::StrCat("collective check on axis \"", axis, "\" failed: ", why));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      baton::v1::AxisOpResult* agg = resp->add_results();
      agg->set_axis(axis);
      agg->set_op(ops[i]);
      agg->set_passed(true);
      for (size_t r = 0; r < results.size(); ++r) {
        const baton::v1::CollectiveResult& cr = results[r].response.results(static_cast<int>(i));
        *agg->add_ranks() = cr;
        agg->set_numel(cr.numel());
        agg->set_group_size(cr.group_ranks_size());
        agg->set_bytes_per_rank(std::max(agg->bytes_per_rank(), cr.bytes_sent()));
        agg->set_seconds(std::max(agg->seconds(), cr.seconds()));
        if (!cr.passed() && agg->passed()) {
          agg->set_passed(false);
          agg->set_error(absl::StrCat(WorkerLabel(mesh, static_cast<int>(r)), ": ", cr.error()));
        }
      }
      passed = passed && agg->passed();
    }
    if (!passed) break;  // the group is broken; later axes would only repeat it
  }
  resp->set_passed(passed);
  if (passed) {
    registry_->SetState(names, baton::v1::CONFIGURED);
    events_->Append("check_passed", "", -1, absl::StrCat(mesh.mesh_id(), " all collectives checked"));
  } else {
    AbortMesh(mesh, "a collective returned a wrong result");
    events_->Append("check_failed", "", -1, "a collective returned a wrong result");
  }
  return grpc::Status::OK;
}

namespace {

// A Watch refused before it started (no token, too many streams).
class RefusedWrite : public grpc::ServerWriteReactor<baton::v1::Event> {
 public:
  void OnDone() override { delete this; }
};

// One Watch stream: writes the events after the client's sequence, then each
// new one as the log announces it. Holds no thread while it waits; at most
// one write is in flight. Deletes itself when gRPC is done with it.
class WatchReactor : public grpc::ServerWriteReactor<baton::v1::Event> {
 public:
  WatchReactor(EventLog* log, int64_t after, size_t history, std::atomic<int>* streams)
      : log_(log), after_(after), streams_(streams) {
    // A new stream starts with at most `history` past events.
    for (auto& e : log_->After(after_, absl::ZeroDuration(), history)) pending_.push_back(std::move(e));
    subscription_ = log_->Subscribe([this] { Pump(); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      FinishOnce(grpc::Status::OK);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    Pump();
  }
  void OnCancel() override { FinishOnce(grpc::Status::OK); }
  void OnDone() override {
    log_->Unsubscribe(subscription_);  // no Pump runs after this returns
    streams_->fetch_sub(1);
    delete this;
  }

 private:
  // Starts the next write if none is in flight and there is something new.
  void Pump() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (pending_.empty()) {
        for (auto& e : log_->After(after_, absl::ZeroDuration())) pending_.push_back(std::move(e));
        if (pending_.empty()) return;
      }
      current_ = std::move(pending_.front());
      pending_.pop_front();
      after_ = current_.sequence();
      writing_ = true;
    }
    StartWrite(&current_);
  }
  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  EventLog* const log_;
  absl::Mutex mu_;
  int64_t after_ ABSL_GUARDED_BY(mu_);
  std::atomic<int>* const streams_;
  int subscription_ = 0;
  std::deque<baton::v1::Event> pending_ ABSL_GUARDED_BY(mu_);
  baton::v1::Event current_;  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerWriteReactor<baton::v1::Event>* ControllerService::Watch(grpc::CallbackServerContext* ctx,
                                                                     const baton::v1::WatchRequest* req) {
  auto refuse = [](const grpc::Status& status) {
    auto* r = new RefusedWrite();
    r->Finish(status);
    return r;
  };
  if (grpc::Status denied = options_.auth.Check(ctx, Role::kClient); !denied.ok()) return refuse(denied);
  if (watch_streams_.fetch_add(1) >= kMaxWatchStreams) {
    watch_streams_.fetch_sub(1);
    return refuse(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               absl::StrCat(kMaxWatchStreams, " Watch streams are open (the limit); close one first")));
  }
  return new WatchReactor(events_, std::max<int64_t>(0, req->after_sequence()), kWatchHistory, &watch_streams_);
}

}  // namespace baton
