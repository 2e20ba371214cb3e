// WorkerRegistry: the controller's view of the fleet.
//
// Each worker name owns a slot (its fleet rank), kept when the same name
// registers again (a restarted pod keeps its rank). A name ending in
// "-<ordinal>" (a StatefulSet pod, or `baton up`'s worker-N) gets rank
// <ordinal> when that is free; otherwise a worker gets the lowest free rank. States, as in proto/mesh.proto:
//
//   REGISTERED --mesh formed--> CONFIGURED --check/step--> RUNNING
//        ^                          ^  |                      |
//        |                          |  +------- done ---------+
//        |                          |
//        +-- Register (new incarnation or after DEAD) --+
//                                                       |
//   any state --no heartbeat for heartbeat_timeout--> DEAD
//
// Thread-safe. The clock is injectable for tests.
#ifndef BATON_CONTROLLER_WORKER_REGISTRY_H_
#define BATON_CONTROLLER_WORKER_REGISTRY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/event_log.h"
#include "google/protobuf/repeated_field.h"
#include "proto/mesh.pb.h"

namespace baton {

class WorkerRegistry {
 public:
  using Clock = std::function<absl::Time()>;

  // A worker is DEAD once no heartbeat arrived for `heartbeat_timeout`.
  WorkerRegistry(absl::Duration heartbeat_timeout, EventLog* events, Clock clock = absl::Now);

  // Adds or refreshes a worker; returns its fleet rank. INVALID_ARGUMENT for
  // a malformed name or address.
  absl::StatusOr<int> Register(const baton::v1::WorkerInfo& info);
  // Records a heartbeat. False when the worker is unknown, DEAD, or of
  // another incarnation: it must register again.
  bool Heartbeat(const std::string& name, const std::string& incarnation);
  // Marks every worker whose heartbeat is older than the timeout DEAD and
  // returns the names newly marked.
  // Also forgets workers DEAD for longer than `forget_after` (their slot and
  // name become free).
  std::vector<std::string> SweepDead();
  // Most workers registered at once; more get RESOURCE_EXHAUSTED.
  static constexpr size_t kMaxWorkers = 4096;
  void set_forget_after(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    forget_after_ = d;
  }
  // Marks `name` DEAD now if it is still the live instance at `address`
  // (its process is known gone: its address refuses connections); whether
  // it did.
  bool DeclareDead(const std::string& name, const std::string& address, const std::string& cause);
  // Sets the state of live workers (DEAD stays DEAD).
  void SetState(const std::vector<std::string>& names, baton::v1::WorkerState state);

  // All workers in fleet-rank order, heartbeat ages filled in.
  std::vector<baton::v1::WorkerInfo> List() const;
  absl::StatusOr<baton::v1::WorkerInfo> Get(const std::string& name) const;
  // The indices in `names` of the workers that are DEAD or unknown, under
  // one lock and copying nothing (a fan-out asks this every 100 ms).
  std::vector<size_t> DeadAmong(const google::protobuf::RepeatedPtrField<std::string>& names) const;
  // Seconds since `name`'s last heartbeat (0 when unknown).
  double HeartbeatAge(const std::string& name) const;

  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

 private:
  struct Record {
    baton::v1::WorkerInfo info;
    absl::Time last_heartbeat;
  };
  baton::v1::WorkerInfo Snapshot(const Record& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration heartbeat_timeout_;
  EventLog* const events_;
  const Clock clock_;

  mutable absl::Mutex mu_;
  absl::Duration forget_after_ ABSL_GUARDED_BY(mu_) = absl::Minutes(10);
  std::map<std::string, Record> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_CONTROLLER_WORKER_REGISTRY_H_
