// StragglerDetector: names the rank that sets the pace of a mesh. A
// synchronous collective makes every rank's step equally long, so a slow
// rank's time shows up as its peers' waits: what is compared is each rank's
// own compute time per step (StepMetrics.compute_ms: the step less its waits
// on communication).
//
// Stages of a pipeline do different work, so every rank's compute is put
// on its stage's scale first: ÷ the stage's typical compute lately, the
// median over its ranks of each one's median over the last
// kHistoryWindows windows (a stage that drifts - a pipeline's last stage
// grew 10 % slower than its first over 1,000 steps on a 2-core host -
// moves its scale along). For a rank's own stage that is its other ranks'
// (its own history when it has none: a pipeline of one replica), so a rank
// slow from the start raises no scale it is measured against. Each step a
// rank's scaled compute is divided by the median of every other rank's:
// data and tensor parallel ranks of one stage compare alike, and a host
// that favours one rank over its only same-stage peer for a while (such a
// pair reached 1.21 against each other alone) is outvoted by the others.
// Its factor is the median of those ratios over a window of steps, so a few
// steps that a busy host stole from a rank do not name it.
//
// A rank is named once when its factor passes the threshold, and again only
// after it went back under the halfway mark (1 + (threshold - 1) / 2), so
// noise around the threshold does not repeat it.
//
// Not thread-safe: the job's runner feeds it from its thread.
#ifndef BATON_CONTROLLER_STRAGGLER_DETECTOR_H_
#define BATON_CONTROLLER_STRAGGLER_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "proto/job.pb.h"

namespace baton {

class StragglerDetector {
 public:
  static constexpr double kDefaultThreshold = 1.2;
  static constexpr int kDefaultWindow = 20;
  // How many windows of its own past set a rank's typical compute.
  static constexpr int kHistoryWindows = 5;

  struct Finding {
    int rank = 0;
    double factor = 0;  // the window's median of its scaled compute ÷ the others' (above)
  };

  // `groups[r]`: the peer group of rank r (PeerGroups).
  StragglerDetector(const baton::v1::StragglerPolicy& policy, std::vector<int> groups);

  // The peer groups of a job placed as `placed`: rank r's coordinate on the
  // pipeline-parallel axis (0 for every rank without one). Ranks are in
  // row-major order of the mesh's coordinates.
  static std::vector<int> PeerGroups(const baton::v1::JobSpec& placed);

  // One step's compute time of every rank (ms); the ranks found slow by it.
  std::vector<Finding> Observe(const std::vector<double>& compute_ms);
  // Each rank's factor over the last window (0 until a window is full).
  const std::vector<double>& factors() const { return factors_; }
  double threshold() const { return threshold_; }
  int window() const { return window_; }

 private:
  const double threshold_;
  const int window_;
  const std::vector<int> groups_;
  // Per rank, each of the last `window_` steps' scaled compute ÷ the other
  // ranks' median that step; and its last kHistoryWindows windows' compute.
  std::vector<std::deque<double>> ratios_;
  std::vector<std::deque<double>> history_;
  std::vector<double> factors_;
  std::vector<bool> named_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_STRAGGLER_DETECTOR_H_
