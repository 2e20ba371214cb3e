// `baton plan`'s output: a dry run (strategies/dry_run.h) as text - the cut
// of the model, every pp rank's schedule as a time-slot grid, the predicted
// bubble, and per rank the state, comm and live-activation figures - or as
// one JSON object. And `baton run`'s closing table of measured figures next
// to the predicted ones.
#ifndef BATON_CLIENT_PLAN_OUTPUT_H_
#define BATON_CLIENT_PLAN_OUTPUT_H_

#include <string>

#include "proto/controller.pb.h"
#include "proto/job.pb.h"
#include "strategies/dry_run.h"

namespace baton {

// `explain` adds every rank's Program, instruction by instruction.
std::string FormatPlan(const baton::v1::JobSpec& job, const DryRun& plan, bool explain);
std::string FormatPlanJson(const baton::v1::JobSpec& job, const DryRun& plan);

// The last step's figures (largest over ranks, as the controller reports
// them) next to what CreateJob predicted, with their ratio.
std::string FormatMeasuredVsPredicted(const baton::v1::CreateJobResponse& created,
                                      const baton::v1::StepMetrics& last, bool json);

}  // namespace baton

#endif  // BATON_CLIENT_PLAN_OUTPUT_H_
