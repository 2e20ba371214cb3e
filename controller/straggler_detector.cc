#include "controller/straggler_detector.h"

#include <algorithm>
#include <utility>

namespace baton {

StragglerDetector::StragglerDetector(const baton::v1::StragglerPolicy& policy, std::vector<int> groups)
    : threshold_(policy.threshold() > 1 ? policy.threshold() : kDefaultThreshold),
      window_(policy.window() > 0 ? policy.window() : kDefaultWindow),
      groups_(std::move(groups)),
      recent_(groups_.size()),
      sums_(groups_.size(), 0),
      baseline_(groups_.size(), 0),
      factors_(groups_.size(), 0),
      named_(groups_.size(), false) {}

std::vector<int> StragglerDetector::PeerGroups(const baton::v1::JobSpec& placed) {
  int size = 1;
  for (const auto& axis : placed.mesh()) size *= axis.size();
  std::vector<int> groups(size, 0);
  const std::string& pp = placed.plan().pipeline_parallel().axis();
  if (!placed.plan().has_pipeline_parallel() || pp.empty()) return groups;
  // Row-major: the last axis varies fastest.
  int stride = 1;
  for (int a = placed.mesh_size() - 1; a >= 0; --a) {
    if (placed.mesh(a).name() == pp) {
      for (int r = 0; r < size; ++r) groups[r] = (r / stride) % placed.mesh(a).size();
      break;
    }
    stride *= placed.mesh(a).size();
  }
  return groups;
}

std::vector<StragglerDetector::Finding> StragglerDetector::Observe(const std::vector<double>& compute_ms) {
  std::vector<Finding> found;
  if (compute_ms.size() != groups_.size()) return found;  // another mesh's figures
  for (size_t r = 0; r < groups_.size(); ++r) {
    recent_[r].push_back(compute_ms[r]);
    sums_[r] += compute_ms[r];
    if (static_cast<int>(recent_[r].size()) > window_) {
      sums_[r] -= recent_[r].front();
      recent_[r].pop_front();
    }
  }
  if (static_cast<int>(recent_[0].size()) < window_) return found;
  for (size_t r = 0; r < groups_.size(); ++r) {
    if (baseline_[r] <= 0) baseline_[r] = sums_[r];
  }
  const double rearm = 1 + (threshold_ - 1) / 2;
  for (size_t r = 0; r < groups_.size(); ++r) {
    std::vector<double> peers;
    for (size_t p = 0; p < groups_.size(); ++p) {
      if (p != r && groups_[p] == groups_[r]) peers.push_back(sums_[p]);
    }
    double base = baseline_[r];
    if (!peers.empty()) {
      std::sort(peers.begin(), peers.end());
      const size_t n = peers.size();
      base = n % 2 == 1 ? peers[n / 2] : (peers[n / 2 - 1] + peers[n / 2]) / 2;
    }
    factors_[r] = base > 0 ? sums_[r] / base : 0;
    if (factors_[r] > threshold_ && !named_[r]) {
      named_[r] = true;
      found.push_back({static_cast<int>(r), factors_[r]});
    } else if (factors_[r] < rearm) {
      named_[r] = false;
    }
  }
  return found;
}

}  // namespace baton
