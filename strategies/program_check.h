// Checks a Program before a worker runs it: everything the Executor indexes
// or divides by must be in range, so a malformed or hostile LoadProgram gets
// INVALID_ARGUMENT instead of crashing the daemon.
#ifndef BATON_STRATEGIES_PROGRAM_CHECK_H_
#define BATON_STRATEGIES_PROGRAM_CHECK_H_

#include "absl/status/status.h"
#include "proto/program.pb.h"

namespace baton {

absl::Status ValidateProgram(const baton::v1::Program& program);

}  // namespace baton

#endif  // BATON_STRATEGIES_PROGRAM_CHECK_H_
