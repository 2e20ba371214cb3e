// EventLog: what happened in the fleet, in order (registrations, deaths,
// meshes, checks), for `Watch` streams and for explaining failures.
// Thread-safe; keeps the most recent kCapacity events.
#ifndef BATON_CONTROLLER_EVENT_LOG_H_
#define BATON_CONTROLLER_EVENT_LOG_H_

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/controller.pb.h"

namespace baton {

class EventLog {
 public:
  static constexpr size_t kCapacity = 10000;
  // Per event: at most 10000 x ~1.2 KiB held.
  static constexpr size_t kMaxMessageBytes = 1024;
  static constexpr size_t kMaxNameBytes = 128;

  void Append(const std::string& kind, const std::string& worker_name, int rank,
              const std::string& message);
  // Events with sequence > after, at most `limit` (the newest of them);
  // waits up to `timeout` when there are none.
  std::vector<baton::v1::Event> After(int64_t after, absl::Duration timeout, size_t limit = kCapacity);

  // `notify` runs after every Append (on the appending thread, never under
  // the log's lock, never after Unsubscribe returned). It must not block.
  int Subscribe(std::function<void()> notify);
  void Unsubscribe(int id);

 private:
  absl::Mutex mu_;
  absl::Mutex subscribers_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<int, std::function<void()>> subscribers_ ABSL_GUARDED_BY(subscribers_mu_);
  int next_subscriber_ ABSL_GUARDED_BY(subscribers_mu_) = 1;
  std::deque<baton::v1::Event> events_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_EVENT_LOG_H_
