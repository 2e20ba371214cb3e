#include "worker/retained_state.h"

#include <vector>

#include "absl/time/clock.h"

namespace baton {

void RetainedStates::Begin() {
  absl::MutexLock lock(&mu_);
  ++taking_;
}

void RetainedStates::Keep(const std::string& job_id, std::unique_ptr<ShardStore> store, int step,
                          std::vector<baton::v1::StepMetrics> recent) {
  std::vector<std::shared_ptr<const Held>> dropped;  // freed outside the lock (declared before it)
  absl::MutexLock lock(&mu_);
  --taking_;
  if (store == nullptr) return;
  auto held = std::make_shared<Held>();
  held->step = step;
  held->bytes = store->state_bytes();
  held->store = std::move(store);
  held->since = absl::Now();
  for (auto& m : recent) {
    if (m.step() <= step) held->recent.push_back(std::move(m));
  }
  dropped.push_back(std::move(held_[job_id]));
  held_[job_id] = std::move(held);
  ExpireLocked(&dropped);
}

std::shared_ptr<const RetainedStates::Held> RetainedStates::Get(const std::string& job_id, absl::Duration wait) {
  std::vector<std::shared_ptr<const Held>> expired;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  auto none_taking = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return taking_ == 0; };
  mu_.AwaitWithTimeout(absl::Condition(&none_taking), wait);
  ExpireLocked(&expired);
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

void RetainedStates::ExpireLocked(std::vector<std::shared_ptr<const Held>>* expired) {
  const absl::Time now = absl::Now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->second->since > kMaxAge) {
      expired->push_back(std::move(it->second));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace baton
