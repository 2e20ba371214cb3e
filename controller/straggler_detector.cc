#include "controller/straggler_detector.h"

#include <algorithm>
#include <utility>

namespace baton {

StragglerDetector::StragglerDetector(const baton::v1::StragglerPolicy& policy, std::vector<int> groups)
    : threshold_(policy.threshold() > 1 ? policy.threshold() : kDefaultThreshold),
      window_(policy.window() > 0 ? policy.window() : kDefaultWindow),
      groups_(std::move(groups)),
      ratios_(groups_.size()),
      first_(groups_.size()),
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

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<StragglerDetector::Finding> StragglerDetector::Observe(const std::vector<double>& compute_ms) {
  std::vector<Finding> found;
  if (compute_ms.size() != groups_.size()) return found;  // another mesh's figures
  const size_t n = groups_.size();
  // A rank with no peer: its own first window is its baseline.
  for (size_t r = 0; r < n; ++r) {
    if (static_cast<int>(first_[r].size()) < window_) first_[r].push_back(compute_ms[r]);
  }
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> peers;
    for (size_t p = 0; p < n; ++p) {
      if (p != r && groups_[p] == groups_[r]) peers.push_back(compute_ms[p]);
    }
    double base = 0;
    if (!peers.empty()) {
      base = Median(std::move(peers));
    } else if (static_cast<int>(first_[r].size()) == window_) {
      base = Median(first_[r]);
    }
    if (base <= 0) continue;  // nothing to compare with yet
    ratios_[r].push_back(compute_ms[r] / base);
    if (static_cast<int>(ratios_[r].size()) > window_) ratios_[r].pop_front();
  }
  const double rearm = 1 + (threshold_ - 1) / 2;
  for (size_t r = 0; r < n; ++r) {
    if (static_cast<int>(ratios_[r].size()) < window_) continue;
    // The median over the window: a few steps a busy host stole from a rank
    // do not make it slow; a rank slow at most of them is.
    factors_[r] = Median({ratios_[r].begin(), ratios_[r].end()});
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
