// Dispatcher: calls one Worker RPC on many workers at once through gRPC's
// callback API, each call with a deadline, and no thread per call: at most
// `max_in_flight` calls of all fan-outs together are on the wire, the rest
// wait their turn in order. A fan-out stops waiting early, cancelling what is
// still in flight, as soon as one call fails (the others cannot succeed
// without it) or `should_abort` names a reason (e.g. a worker of the mesh was
// declared DEAD). With a FailureGrace it first tells the workers to stop
// (on_failure) and gives their calls a moment to return by themselves, so
// every worker's own outcome is known.
//
// Stubs come from a StubFactory, once per address: the real one opens a
// channel with the fleet's credentials; tests hand in-process fake workers.
//
// Thread-safe; Call() blocks the calling thread (only) until every call of
// its fan-out has returned; Start() returns at once, and the fan-out's
// PendingFanOut::Wait() blocks instead. Completion callbacks run on gRPC's threads and
// never block.
#ifndef BATON_CONTROLLER_DISPATCHER_H_
#define BATON_CONTROLLER_DISPATCHER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/security.h"
#include "proto/worker.grpc.pb.h"

namespace baton {

using WorkerStub = baton::v1::Worker::StubInterface;
// The stub for a worker's address; called once per address.
using StubFactory = std::function<std::shared_ptr<WorkerStub>(const std::string& address)>;
// Real stubs: a channel per address with `credentials`, reconnecting fast
// after a worker restarts on the same address.
StubFactory GrpcStubFactory(Credentials credentials);

// One Worker RPC as the dispatcher starts it: its messages and the callback
// form of its stub method.
#define BATON_WORKER_RPC(Name)                                                                                   \
  struct Name##Rpc {                                                                                             \
    using Request = baton::v1::Name##Request;                                                                    \
    using Response = baton::v1::Name##Response;                                                                  \
    static constexpr const char* kName = #Name;                                                                  \
    static void Start(WorkerStub* stub, grpc::ClientContext* ctx, const Request* req, Response* resp,          \
                      std::function<void(grpc::Status)> done) {                                                  \
      stub->async()->Name(ctx, req, resp, std::move(done));                                                      \
    }                                                                                                            \
  };
BATON_WORKER_RPC(Configure)
BATON_WORKER_RPC(Abort)
BATON_WORKER_RPC(GetInfo)
BATON_WORKER_RPC(LoadProgram)
BATON_WORKER_RPC(RunStep)
BATON_WORKER_RPC(SaveShards)
BATON_WORKER_RPC(LoadShards)
BATON_WORKER_RPC(GetRetained)
BATON_WORKER_RPC(ReleaseState)
#undef BATON_WORKER_RPC
struct CollectiveCheckRpc {
  using Request = baton::v1::CollectiveCheckRequest;
  using Response = baton::v1::CollectiveCheckResponse;
  static constexpr const char* kName = "RunCollectiveCheck";
  static void Start(WorkerStub* stub, grpc::ClientContext* ctx, const Request* req, Response* resp,
                    std::function<void(grpc::Status)> done) {
    stub->async()->RunCollectiveCheck(ctx, req, resp, std::move(done));
  }
};
struct FinishSaveRpc {
  using Request = baton::v1::FinishSaveRequest;
  using Response = baton::v1::SaveShardsResponse;
  static constexpr const char* kName = "FinishSave";
  static void Start(WorkerStub* stub, grpc::ClientContext* ctx, const Request* req, Response* resp,
                    std::function<void(grpc::Status)> done) {
    stub->async()->FinishSave(ctx, req, resp, std::move(done));
  }
};

// Who a call is for: the worker's name (sent as kAddresseeMetadata; empty:
// none) and its address. Workers at one address share a connection.
struct WorkerTarget {
  std::string name;
  std::string address;
};

template <typename Resp>
struct CallResult {
  grpc::Status status;
  Resp response;
  absl::Duration elapsed;  // from the fan-out's start to this call's end
};

// On the first failure (or abort reason): `on_failure(statuses so far,
// abort reason)` runs on the calling thread - calls still in flight read OK -
// and returns the calls not worth waiting for (their worker is known dead),
// which are cancelled at once; the rest get up to `wait` to return before
// they are cancelled.
struct FailureGrace {
  std::function<std::vector<size_t>(const std::vector<grpc::Status>&, const std::string&)> on_failure;
  absl::Duration wait;
};

struct FanOut {
  absl::Duration deadline = absl::Seconds(10);
  // Polled every kAbortPollInterval while calls are outstanding; "" keeps
  // waiting, anything else is the reason to stop.
  std::function<std::string()> should_abort;
  const FailureGrace* failure_grace = nullptr;
};

template <typename Rpc>
class PendingFanOut;

class Dispatcher {
 public:
  // Twice the most workers a fleet may have: beyond one long call (a step) and
  // one short one (an abort, a probe) per worker, calls wait their turn.
  static constexpr int kDefaultMaxInFlight = 8192;
  explicit Dispatcher(StubFactory stubs, int max_in_flight = kDefaultMaxInFlight);
  ~Dispatcher();

  // How often an in-progress fan-out re-evaluates `should_abort`.
  static constexpr absl::Duration kAbortPollInterval = absl::Milliseconds(100);
  // A call whose connection could not be made is tried once more after this
  // pause (seen once under load on loopback with a live worker); a worker
  // that is really gone refuses again and fails within the pause.
  static constexpr absl::Duration kReconnectPause = absl::Milliseconds(200);
  static bool IsConnectFailure(const grpc::Status& s);

  // Calls Rpc on every target, `request(i)` to the i-th, all at once
  // (within the in-flight bound). `abort_reason` (if given) receives
  // should_abort's reason when it stopped the fan-out.
  template <typename Rpc>
  std::vector<CallResult<typename Rpc::Response>> Call(
      const std::vector<WorkerTarget>& targets,
      const std::function<typename Rpc::Request(size_t)>& request, const FanOut& options,
      std::string* abort_reason = nullptr);
  // The same calls, put on the wire now and waited for later
  // (PendingFanOut::Wait): the caller may wait for an earlier fan-out
  // meanwhile. `deadline` is the fan-out's, from now.
  template <typename Rpc>
  std::unique_ptr<PendingFanOut<Rpc>> Start(const std::vector<WorkerTarget>& targets,
                                            const std::function<typename Rpc::Request(size_t)>& request,
                                            absl::Duration deadline);

  // Calls on the wire now, and the most there have been at once.
  int in_flight() const;
  int peak_in_flight() const;

 private:
  template <typename Rpc>
  friend class PendingFanOut;
  struct Slot;
  struct Batch;
  struct Launch;
  // Puts a fan-out whose slots know how to start their calls on the wire.
  void Begin(Batch& batch, absl::Duration deadline);
  // Waits for a begun fan-out as Call() does; returns when every call has
  // completed.
  void Await(Batch& batch, const FanOut& options, std::string* abort_reason);
  // Cancels what is left of a begun fan-out and waits for its calls.
  void Abandon(Batch& batch);
  // Makes `slot` ready to start (into `launches`, started once the lock is
  // released: a call may complete on the thread that starts it, and its
  // callback takes the lock) or queues it behind the in-flight bound.
  void Submit(Batch* batch, size_t slot, std::vector<Launch>* launches) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartLocked(Batch* batch, size_t slot, std::vector<Launch>* launches) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void LaunchAll(std::vector<Launch>& launches);
  // Marks a slot finished with `status` (under the lock).
  static void FinishSlot(Batch* batch, Slot& slot, grpc::Status status);
  void OnDone(Batch* batch, size_t slot, grpc::Status status);
  // Marks the calls of `batch` (`only` those, when given) cancelled: queued
  // ones end at once; returns the contexts of those in flight, to TryCancel
  // once the lock is released (gRPC may run the call's callback, which takes
  // the lock, inside TryCancel).
  std::vector<grpc::ClientContext*> CancelBatch(Batch* batch, const std::vector<size_t>& only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<WorkerStub> StubFor(const std::string& address);

  const StubFactory stubs_;
  const int max_in_flight_;
  absl::Mutex stubs_mu_;
  std::map<std::string, std::shared_ptr<WorkerStub>> stub_cache_ ABSL_GUARDED_BY(stubs_mu_);

  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls waiting for room, oldest first.
  std::deque<std::pair<Batch*, size_t>> waiting_ ABSL_GUARDED_BY(mu_);
};

// A fan-out's calls. Each slot's `start` begins its call with the slot's
// context; its request and response live in the typed vectors of Call().
struct Dispatcher::Slot {
  enum State { kQueued, kInFlight, kRetryWait, kDone };
  std::function<void(WorkerStub*, grpc::ClientContext*, std::function<void(grpc::Status)>)> start;
  std::shared_ptr<WorkerStub> stub;
  std::string worker;  // the addressee
  std::unique_ptr<grpc::ClientContext> ctx;
  State state = kQueued;
  bool cancelled = false;  // asked to stop; a queued call never starts
  int attempts = 0;
  absl::Time retry_at;
  grpc::Status status;
  absl::Duration elapsed;
};

struct Dispatcher::Launch {
  std::function<void(WorkerStub*, grpc::ClientContext*, std::function<void(grpc::Status)>)>* start;
  WorkerStub* stub;
  grpc::ClientContext* ctx;
  std::function<void(grpc::Status)> done;
};

struct Dispatcher::Batch {
  std::vector<Slot> slots;
  absl::Time start;
  absl::Time end;  // the fan-out's deadline
  size_t done = 0;
  bool failed = false;
  absl::CondVar changed;
};

// A fan-out on the wire that nobody waits for yet (Dispatcher::Start).
// Destroyed without a Wait, its calls are cancelled and waited for.
// Not thread-safe: one thread starts, waits for and destroys it.
template <typename Rpc>
class PendingFanOut {
 public:
  using Response = typename Rpc::Response;
  ~PendingFanOut() {
    if (!waited_) dispatcher_->Abandon(batch_);
  }
  PendingFanOut(const PendingFanOut&) = delete;
  PendingFanOut& operator=(const PendingFanOut&) = delete;

  // Waits for every call, as Dispatcher::Call does (`options.deadline` was
  // given to Start); once.
  std::vector<CallResult<Response>> Wait(const FanOut& options, std::string* abort_reason = nullptr) {
    dispatcher_->Await(batch_, options, abort_reason);
    waited_ = true;
    for (size_t i = 0; i < results_.size(); ++i) {
      results_[i].status = batch_.slots[i].status;
      results_[i].elapsed = batch_.slots[i].elapsed;
    }
    return std::move(results_);
  }

 private:
  friend class Dispatcher;
  explicit PendingFanOut(Dispatcher* dispatcher) : dispatcher_(dispatcher) {}

  Dispatcher* const dispatcher_;
  std::vector<typename Rpc::Request> requests_;  // sized once: the calls point into them
  std::vector<CallResult<Response>> results_;
  Dispatcher::Batch batch_;
  bool waited_ = false;
};

template <typename Rpc>
std::unique_ptr<PendingFanOut<Rpc>> Dispatcher::Start(const std::vector<WorkerTarget>& targets,
                                                      const std::function<typename Rpc::Request(size_t)>& request,
                                                      absl::Duration deadline) {
  std::unique_ptr<PendingFanOut<Rpc>> fan_out(new PendingFanOut<Rpc>(this));
  const size_t n = targets.size();
  fan_out->requests_.reserve(n);
  for (size_t i = 0; i < n; ++i) fan_out->requests_.push_back(request(i));
  fan_out->results_.resize(n);
  fan_out->batch_.slots.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Slot& s = fan_out->batch_.slots[i];
    s.stub = StubFor(targets[i].address);
    s.worker = targets[i].name;
    s.start = [req = &fan_out->requests_[i], resp = &fan_out->results_[i].response](
                  WorkerStub* stub, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
      resp->Clear();
      Rpc::Start(stub, ctx, req, resp, std::move(done));
    };
  }
  Begin(fan_out->batch_, deadline);
  return fan_out;
}

template <typename Rpc>
std::vector<CallResult<typename Rpc::Response>> Dispatcher::Call(
    const std::vector<WorkerTarget>& targets, const std::function<typename Rpc::Request(size_t)>& request,
    const FanOut& options, std::string* abort_reason) {
  return Start<Rpc>(targets, request, options.deadline)->Wait(options, abort_reason);
}

}  // namespace baton

#endif  // BATON_CONTROLLER_DISPATCHER_H_
