// The collective operations `baton check` runs, in order. Shared by the
// controller (which asks for them) and the worker (which runs them).
#ifndef BATON_COMMON_COLLECTIVE_OPS_H_
#define BATON_COMMON_COLLECTIVE_OPS_H_

#include <cstdint>
#include <vector>

#include "proto/collective.pb.h"

namespace baton {

// Bounds on one collective check, shared by the controller (which validates
// a client's request) and the worker (which validates the controller's):
// 64 Mi elements is 256 MiB of fp32 per buffer, and a check holds a few.
inline constexpr int64_t kMaxCheckNumel = int64_t{64} << 20;
inline constexpr int64_t kMaxCheckTimeoutMs = 600000;

inline std::vector<baton::v1::CollectiveOp> AllCollectiveOps() {
  using namespace baton::v1;  // NOLINT: enum values
  return {ALL_REDUCE_SUM,     ALL_REDUCE_AVG, ALL_REDUCE_MAX, ALL_GATHER, ALL_GATHER_UNEVEN,
          REDUCE_SCATTER_SUM, REDUCE_SCATTER_AVG, SEND_RECV_RING, BROADCAST, BARRIER};
}

}  // namespace baton

#endif  // BATON_COMMON_COLLECTIVE_OPS_H_
