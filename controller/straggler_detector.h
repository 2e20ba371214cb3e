// StragglerDetector: names the rank that sets the pace of a mesh. A
// synchronous collective makes every rank's step equally long, so a slow
// rank's time shows up as its peers' waits: what is compared is each rank's
// own compute time per step (StepMetrics.compute_ms: the step less its waits
// on communication) against the median of its peers' that step; its factor
// is the median of those ratios over a window of steps, so a few steps that
// a busy host stole from a rank do not name it. Peers are the ranks that do the same
// work: those of the same pipeline stage (data and tensor parallel ranks of
// a stage compute alike; stages differ). A rank with no peer (a pipeline of
// one replica) is compared with its own first window instead.
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

  struct Finding {
    int rank = 0;
    double factor = 0;  // the window's median of its compute ÷ its peers' median
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
  // Per rank, each of the last `window_` steps' compute ÷ its peers' median
  // that step (or its own first window's median).
  std::vector<std::deque<double>> ratios_;
  std::vector<std::vector<double>> first_;  // per rank, its first `window_` compute times
  std::vector<double> factors_;
  std::vector<bool> named_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_STRAGGLER_DETECTOR_H_
