// What `baton plan` shows without starting a worker: the job compiled into
// every rank's Program, the figures the plan predicts per rank, and - with a
// pipeline - how the model is cut and each rank's schedule in time slots.
#ifndef BATON_STRATEGIES_DRY_RUN_H_
#define BATON_STRATEGIES_DRY_RUN_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/program.pb.h"
#include "strategies/pipeline.h"
#include "strategies/plan_theory.h"

namespace baton {

struct DryRun {
  std::vector<baton::v1::Program> programs;  // by rank
  PlanTheory theory;                         // .ranks by rank
  std::vector<std::string> coordinates;      // by rank: "pp=1,dp=0"
  PipelinePlan pipeline;                     // .enabled = false without one
  std::vector<std::string> chunks;           // by chunk: the units it holds, "layers.2, layers.3"
  std::optional<PipelineTimeline> timeline;  // with a pipeline: by pp rank
  // By rank: the fraction of the step the rank idles waiting for another
  // stage, as the timeline predicts it (0 without a pipeline).
  std::vector<double> idle_fraction;
  double max_idle_fraction = 0;  // the largest of them
  double bubble_formula = 0;     // (p-1)/(v m+p-1) with a pipeline
};

// Applies the defaults and validates `spec` as the controller does, then
// plans it.
absl::StatusOr<DryRun> PlanDryRun(const baton::v1::JobSpec& spec);

}  // namespace baton

#endif  // BATON_STRATEGIES_DRY_RUN_H_
