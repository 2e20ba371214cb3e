// Whether a job's ranks fit the workers that would run them: threads per
// rank within a worker's cores, the plan's predicted per-rank growth
// (strategies/plan_theory.h: memory_bytes), and where two of the job's
// workers share a host the shared-memory segments of its collectives
// (shared_memory_bytes), within its share of the host's memory. Refused
// before any worker is touched.
#ifndef BATON_CONTROLLER_JOB_FIT_H_
#define BATON_CONTROLLER_JOB_FIT_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "proto/mesh.pb.h"
#include "strategies/plan_theory.h"

namespace baton {

// `chosen`: the workers that would run the ranks; `fleet`: every worker (the
// live ones on a host share its memory and cores, which each reports whole).
absl::Status CheckFits(const baton::v1::JobSpec& job, const PlanTheory& theory,
                       const std::vector<baton::v1::WorkerInfo>& chosen,
                       const std::vector<baton::v1::WorkerInfo>& fleet);

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_FIT_H_
