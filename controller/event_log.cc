#include "controller/event_log.h"

#include <algorithm>
#include <cstdio>

#include "absl/time/clock.h"
#include "common/log.h"

namespace baton {
namespace {

// At most `limit` bytes of `s`, cut at a UTF-8 character boundary (a string
// field must stay valid UTF-8 for every client that parses the event).
std::string Cut(const std::string& s, size_t limit, const char* mark) {
  if (s.size() <= limit) return s;
  size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + mark;
}

}  // namespace

void EventLog::Append(const std::string& kind, const std::string& worker_name, int rank, const std::string& message) {
  baton::v1::Event e;
  e.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
  e.set_kind(kind);
  // Bounded: a name or message someone sent is cut, not copied whole.
  e.set_worker_name(Cut(worker_name, kMaxNameBytes, ""));
  e.set_rank(rank);
  e.set_message(Cut(message, kMaxMessageBytes, "..."));
  // Logged before it is numbered: stderr is not written under the lock
  // readers take.
  LogEvent(kind, e.worker_name(), rank, e.message());
  {
    absl::MutexLock lock(&mu_);
    e.set_sequence(next_sequence_++);
    events_.push_back(std::move(e));
    if (events_.size() > kCapacity) events_.pop_front();
  }
  absl::MutexLock lock(&subscribers_mu_);
  for (const auto& [id, notify] : subscribers_) notify();
}

int EventLog::Subscribe(std::function<void()> notify) {
  absl::MutexLock lock(&subscribers_mu_);
  const int id = next_subscriber_++;
  subscribers_[id] = std::move(notify);
  return id;
}

void EventLog::Unsubscribe(int id) {
  absl::MutexLock lock(&subscribers_mu_);
  subscribers_.erase(id);
}

std::vector<baton::v1::Event> EventLog::After(int64_t after, absl::Duration timeout, size_t limit) {
  absl::MutexLock lock(&mu_);
  auto has_new = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_sequence_ - 1 > after; };
  mu_.AwaitWithTimeout(absl::Condition(&has_new), timeout);
  std::vector<baton::v1::Event> out;
  // The newest `limit` of those after `after`.
  auto first = std::partition_point(events_.begin(), events_.end(),
                                    [after](const baton::v1::Event& e) { return e.sequence() <= after; });
  if (static_cast<size_t>(events_.end() - first) > limit) first = events_.end() - static_cast<std::ptrdiff_t>(limit);
  out.assign(first, events_.end());
  return out;
}

}  // namespace baton
