// A job compiled as the controller runs it (PlanJob: every rank's Program,
// checked as the workers will check it, and what the plan predicts), and
// what `baton plan` shows of it without starting a worker (PlanDryRun: how
// the model is cut into chunks, each rank's coordinates and, with a
// pipeline, its schedule in time slots).
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

struct JobPlan {
  std::vector<baton::v1::Program> programs;  // by rank
  PlanTheory theory;                         // .ranks by rank
  PipelinePlan pipeline;                     // .enabled = false without one
  std::optional<PipelineTimeline> timeline;  // with a pipeline: by pp rank
  // By rank: the fraction of the step the rank idles waiting for another
  // stage, as the timeline predicts it (0 without a pipeline).
  std::vector<double> idle_fraction;
  double max_idle_fraction = 0;  // the largest of them
};

// Applies the defaults and validates `spec`, compiles it for job `job_id`
// and checks every Program as the workers will.
absl::StatusOr<JobPlan> PlanJob(const baton::v1::JobSpec& spec, const std::string& job_id);
// The same for a spec admitted already (its defaults applied, validated):
// neither is done again.
absl::StatusOr<JobPlan> PlanCheckedJob(const baton::v1::JobSpec& checked, const std::string& job_id);

struct DryRun : JobPlan {
  std::vector<std::string> coordinates;  // by rank: "pp=1,dp=0"
  std::vector<std::string> chunks;       // by chunk: the units it holds, "layers.2, layers.3"
  double bubble_formula = 0;             // (p-1)/(v m+p-1) with a pipeline
};

// PlanJob, and what `baton plan` presents of it.
absl::StatusOr<DryRun> PlanDryRun(const baton::v1::JobSpec& spec);

}  // namespace baton

#endif  // BATON_STRATEGIES_DRY_RUN_H_
