// Checks of the parts of a job that both the planner (on a JobSpec) and the
// worker (on a Program, before running it) rely on: the model, the optimizer
// and the data source. Each returns INVALID_ARGUMENT naming the field and
// what would be valid; callers prefix where the value came from.
#ifndef BATON_PROGRAM_SPEC_CHECK_H_
#define BATON_PROGRAM_SPEC_CHECK_H_

#include "absl/status/status.h"
#include "proto/job.pb.h"

namespace baton {

absl::Status ValidateModel(const baton::v1::ModelSpec& model);
absl::Status ValidateOptimizer(const baton::v1::OptimizerSpec& optimizer);
// The source and the global batch (not how it divides over ranks).
absl::Status ValidateData(const baton::v1::DataSpec& data, const baton::v1::ModelSpec& model);

}  // namespace baton

#endif  // BATON_PROGRAM_SPEC_CHECK_H_
