// A job's recorded steps (controller/job_trace.h) as one Chrome trace-event
// JSON file, which Perfetto and chrome://tracing open:
//   - a process per rank ("rank 2 · worker-1"), ordered by rank;
//   - its thread "compute": one complete ("X") slice per Program
//     instruction per step, named by its op; its args: step, instruction
//     (index), what it names (stage, microbatch, unit, group, peer), the
//     bytes this rank sent while it ran and the plan's bytes for it
//     (strategies/plan_theory.h: instruction_comm);
//   - threads "comm 0", "comm 1", ...: each collective issued and awaited
//     later (gather, reduce-scatter, all-reduce), from its issue to its
//     await's end, on the first lane free then (they overlap one another);
//   - threads "io 0", ...: the checkpoint saves of those steps ("checkpoint
//     copy", "checkpoint write"; args: step, bytes);
//   - every time on the controller's clock: a rank's times less its
//     offset (clocks), the earliest span at 0. "otherData" holds the job,
//     the steps, each rank's offset and its bound, and each rank's
//     instructions per step.
// Written with nlohmann::json, never by hand.
#ifndef BATON_CONTROLLER_TRACE_JSON_H_
#define BATON_CONTROLLER_TRACE_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/job_trace.h"
#include "proto/controller.pb.h"

namespace baton {

struct ChromeTrace {
  std::string json;
  int64_t slices = 0;  // "X" events
};

// `clocks`: by rank. INVALID_ARGUMENT when the spans do not fit the
// Programs (another plan's).
absl::StatusOr<ChromeTrace> WriteChromeTrace(const std::string& job_id, const JobTrace::Recorded& recorded,
                                             const std::vector<baton::v1::RankClock>& clocks);

}  // namespace baton

#endif  // BATON_CONTROLLER_TRACE_JSON_H_
