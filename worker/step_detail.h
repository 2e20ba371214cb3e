// A step's figures that only this worker uses (its /metrics: bytes sent by
// collective, seconds per instruction kind). They never leave the worker,
// so they are not part of the wire's StepMetrics, whose figures the
// controller merges over ranks.
#ifndef BATON_WORKER_STEP_DETAIL_H_
#define BATON_WORKER_STEP_DETAIL_H_

#include <cstdint>
#include <map>
#include <string>

namespace baton {

struct StepDetail {
  // "all_gather", "reduce_scatter", ...: they add up to StepMetrics.comm_bytes.
  std::map<std::string, int64_t> comm_bytes_by_collective;
  // "FORWARD", "BACKWARD", ...
  std::map<std::string, double> instruction_seconds;
};

}  // namespace baton

#endif  // BATON_WORKER_STEP_DETAIL_H_
