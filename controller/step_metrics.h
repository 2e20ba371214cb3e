// One step's figures for a job from every rank's (RunStep responses, each
// holding one StepMetrics per step the call ran).
#ifndef BATON_CONTROLLER_STEP_METRICS_H_
#define BATON_CONTROLLER_STEP_METRICS_H_

#include <vector>

#include "controller/dispatcher.h"
#include "proto/job.pb.h"

namespace baton {

// Step `index` of the call (every result holds it). Its time is `wall_ms`:
// the controller's wall time for the whole fan-out divided by the steps it
// ran (what a user waits for); the loss and gradient norm are those of a rank
// that computes the loss (they agree after REDUCE_METRICS); tokens are summed
// over the ranks that count them (once per data-parallel replica); per-rank
// figures are the maximum.
baton::v1::StepMetrics AggregateStep(const std::vector<CallResult<baton::v1::RunStepResponse>>& results, int index,
                                     double wall_ms);

}  // namespace baton

#endif  // BATON_CONTROLLER_STEP_METRICS_H_
