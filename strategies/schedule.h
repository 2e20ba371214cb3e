// The order in which a rank runs (forward | backward, stage, microbatch): the
// seam between what a schedule decides and what each parallelism inserts
// around it (FSDP its gathers, frees and reductions per unit; pipeline
// parallelism its sends and receives between stages). The planner walks
// whatever order a Schedule yields; the data-parallel order is the first
// implementation, GPipe and 1F1B are the next ones.
#ifndef BATON_STRATEGIES_SCHEDULE_H_
#define BATON_STRATEGIES_SCHEDULE_H_

#include <string>
#include <vector>

namespace baton {

struct Pass {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Pass& o) const {
    return kind == o.kind && stage == o.stage && microbatch == o.microbatch;
  }
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual std::string name() const = 0;
  // Every (pass, stage, microbatch) of one step for a rank that runs
  // `stages` (in forward order), each exactly once, forward before backward
  // for every (stage, microbatch).
  virtual std::vector<Pass> Order(const std::vector<int>& stages, int microbatches) const = 0;
};

// Data parallelism with gradient accumulation: each microbatch in turn,
// forward through every stage, then backward through them in reverse.
class SequentialSchedule : public Schedule {
 public:
  std::string name() const override { return "sequential"; }
  std::vector<Pass> Order(const std::vector<int>& stages, int microbatches) const override;
};

}  // namespace baton

#endif  // BATON_STRATEGIES_SCHEDULE_H_
