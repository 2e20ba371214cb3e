// SequencedLog: an append-only, bounded, numbered log that readers page
// through by sequence number and streams follow (the fleet's events, each
// job's log). Entry is a protobuf message with `sequence` and
// `time_unix_ms` fields.
//
// Thread-safe. Subscribers' callbacks run after every Append (and Close) on
// the appending thread, never under the log's lock and never after
// Unsubscribe returned; they must not block.
#ifndef BATON_CONTROLLER_SEQUENCED_LOG_H_
#define BATON_CONTROLLER_SEQUENCED_LOG_H_

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace baton {

template <typename Entry>
class SequencedLog {
 public:
  explicit SequencedLog(size_t capacity) : capacity_(capacity) {}
  virtual ~SequencedLog() = default;

  // Numbers `e` (and stamps it, unless it carries a time) and keeps it; the
  // oldest entry goes once there are `capacity` of them. Returns its
  // sequence number.
  int64_t Add(Entry e) {
    int64_t sequence;
    if (e.time_unix_ms() == 0) e.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
    {
      absl::MutexLock lock(&mu_);
      sequence = next_sequence_++;
      e.set_sequence(sequence);
      entries_.push_back(std::move(e));
      if (entries_.size() > capacity_) entries_.pop_front();
    }
    Notify();
    return sequence;
  }
  // Numbers from `next` on (if past the next one): what a controller that
  // restarted numbers its entries from, so that they follow every entry
  // its predecessor numbered, written or not.
  void SkipTo(int64_t next) {
    absl::MutexLock lock(&mu_);
    next_sequence_ = std::max(next_sequence_, next);
  }
  // Keeps an entry that was numbered before (read back from a file): the
  // log continues after the largest number it has seen.
  void Restore(Entry e) {
    absl::MutexLock lock(&mu_);
    next_sequence_ = std::max(next_sequence_, e.sequence() + 1);
    entries_.push_back(std::move(e));
    if (entries_.size() > capacity_) entries_.pop_front();
  }
  // No entry follows: a stream that has sent everything ends.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    Notify();
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // Entries with sequence > after, at most `limit` (the newest of them);
  // waits up to `timeout` when there are none and the log is open.
  std::vector<Entry> After(int64_t after, absl::Duration timeout = absl::ZeroDuration(),
                           size_t limit = SIZE_MAX) const {
    absl::MutexLock lock(&mu_);
    auto has_new = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_sequence_ - 1 > after || closed_; };
    if (timeout > absl::ZeroDuration()) mu_.AwaitWithTimeout(absl::Condition(&has_new), timeout);
    auto first = std::partition_point(entries_.begin(), entries_.end(),
                                      [after](const Entry& e) { return e.sequence() <= after; });
    if (static_cast<size_t>(entries_.end() - first) > limit) first = entries_.end() - static_cast<std::ptrdiff_t>(limit);
    return std::vector<Entry>(first, entries_.end());
  }
  int64_t last_sequence() const {
    absl::MutexLock lock(&mu_);
    return next_sequence_ - 1;
  }

  int Subscribe(std::function<void()> notify) {
    absl::MutexLock lock(&subscribers_mu_);
    const int id = next_subscriber_++;
    subscribers_[id] = std::move(notify);
    return id;
  }
  void Unsubscribe(int id) {
    absl::MutexLock lock(&subscribers_mu_);
    subscribers_.erase(id);
  }

 private:
  void Notify() {
    absl::MutexLock lock(&subscribers_mu_);
    for (const auto& [id, notify] : subscribers_) notify();
  }

  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::Mutex subscribers_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<int, std::function<void()>> subscribers_ ABSL_GUARDED_BY(subscribers_mu_);
  int next_subscriber_ ABSL_GUARDED_BY(subscribers_mu_) = 1;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_SEQUENCED_LOG_H_
