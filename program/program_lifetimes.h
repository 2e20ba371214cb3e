// Part of ValidateProgram (program/program_check.h): what only a replay of a
// Program's instructions shows.
#ifndef BATON_PROGRAM_PROGRAM_LIFETIMES_H_
#define BATON_PROGRAM_PROGRAM_LIFETIMES_H_

#include "absl/status/status.h"
#include "proto/program.pb.h"

namespace baton {

// Gathered parameters and gradient reductions in flight, over one step of
// `p`, whose instructions are already known to be in range: INVALID_ARGUMENT
// naming the first instruction that breaks them.
absl::Status CheckLifetimes(const baton::v1::Program& p);

}  // namespace baton

#endif  // BATON_PROGRAM_PROGRAM_LIFETIMES_H_
