#include "strategies/schedule.h"

namespace baton {

std::vector<Pass> SequentialSchedule::Order(const std::vector<int>& stages, int microbatches) const {
  std::vector<Pass> order;
  for (int mb = 0; mb < microbatches; ++mb) {
    for (int s : stages) order.push_back({Pass::kForward, s, mb});
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) order.push_back({Pass::kBackward, *it, mb});
  }
  return order;
}

}  // namespace baton
