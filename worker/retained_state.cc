#include "worker/retained_state.h"

#include <vector>

#include "absl/time/clock.h"
#include "worker/caching_allocator.h"

namespace baton {

RetainedStates::Held::~Held() {
  store.reset();
  ReleaseCachedBlocks();
}

void RetainedStates::Begin() {
  absl::MutexLock lock(&mu_);
  ++taking_;
}

void RetainedStates::Keep(const std::string& job_id, std::unique_ptr<ShardStore> store, int step) {
  std::shared_ptr<const Held> replaced;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  --taking_;
  if (store == nullptr) return;
  auto held = std::make_shared<Held>();
  held->step = step;
  held->bytes = store->state_bytes();
  held->store = std::move(store);
  held->since = absl::Now();
  replaced = std::move(held_[job_id]);
  held_[job_id] = std::move(held);
  ExpireLocked();
}

std::shared_ptr<const RetainedStates::Held> RetainedStates::Get(const std::string& job_id, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto none_taking = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return taking_ == 0; };
  mu_.AwaitWithTimeout(absl::Condition(&none_taking), wait);
  ExpireLocked();
  auto it = held_.find(job_id);
  return it == held_.end() ? nullptr : it->second;
}

int64_t RetainedStates::Release(const std::string& job_id) {
  std::vector<std::shared_ptr<const Held>> dropped;
  int64_t bytes = 0;
  absl::MutexLock lock(&mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (job_id.empty() || it->first == job_id) {
      bytes += it->second->bytes;
      dropped.push_back(std::move(it->second));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return bytes;
}

void RetainedStates::ExpireLocked() {
  const absl::Time now = absl::Now();
  for (auto it = held_.begin(); it != held_.end();) {
    it = now - it->second->since > kMaxAge ? held_.erase(it) : std::next(it);
  }
}

}  // namespace baton
