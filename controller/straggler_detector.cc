#include "controller/straggler_detector.h"

#include <algorithm>
#include <utility>

namespace baton {

StragglerDetector::StragglerDetector(const baton::v1::StragglerPolicy& policy, std::vector<int> groups)
    : threshold_(policy.threshold() > 1 ? policy.threshold() : kDefaultThreshold),
      window_(policy.window() > 0 ? policy.window() : kDefaultWindow),
      groups_(std::move(groups)),
      ratios_(groups_.size()),
      history_(groups_.size()),
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
  const size_t n = groups_.size();
  if (compute_ms.size() != n || n < 2) return found;  // another mesh's figures, or nobody to compare with
  // Each rank's typical compute lately: the median of its last kHistoryWindows
  // windows (a stage that drifts slowly moves it along).
  std::vector<double> typical(n);
  for (size_t r = 0; r < n; ++r) {
    history_[r].push_back(compute_ms[r]);
    if (static_cast<int>(history_[r].size()) > kHistoryWindows * window_) history_[r].pop_front();
    typical[r] = Median({history_[r].begin(), history_[r].end()});
  }
  int stages = 0;
  for (int g : groups_) stages = std::max(stages, g + 1);
  std::vector<std::vector<double>> by_stage(stages);
  for (size_t r = 0; r < n; ++r) by_stage[groups_[r]].push_back(typical[r]);
  std::vector<double> stage_scale(stages);
  for (int g = 0; g < stages; ++g) stage_scale[g] = Median(by_stage[g]);
  for (size_t r = 0; r < n; ++r) {
    // Rank r's own stage is scaled by its other ranks' (by its own history
    // when it has none): a rank slow from the start raises no scale it is
    // measured against.
    std::vector<double> peers;
    for (size_t q = 0; q < n; ++q) {
      if (q != r && groups_[q] == groups_[r]) peers.push_back(typical[q]);
    }
    const double own_stage = peers.empty() ? typical[r] : Median(std::move(peers));
    auto scale = [&](size_t p) { return groups_[p] == groups_[r] ? own_stage : stage_scale[groups_[p]]; };
    std::vector<double> others;
    for (size_t p = 0; p < n; ++p) {
      if (p != r && scale(p) > 0) others.push_back(compute_ms[p] / scale(p));
    }
    const double base = Median(std::move(others));
    if (base <= 0 || scale(r) <= 0) continue;
    ratios_[r].push_back(compute_ms[r] / scale(r) / base);
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
