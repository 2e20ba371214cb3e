// The collective operations `baton check` runs, in order. Shared by the
// controller (which asks for them) and the worker (which runs them).
#ifndef BATON_COMMON_COLLECTIVE_OPS_H_
#define BATON_COMMON_COLLECTIVE_OPS_H_

#include <vector>

#include "proto/collective.pb.h"

namespace baton {

inline std::vector<baton::v1::CollectiveOp> AllCollectiveOps() {
  using namespace baton::v1;  // NOLINT: enum values
  return {ALL_REDUCE_SUM,     ALL_REDUCE_AVG, ALL_REDUCE_MAX, ALL_GATHER, ALL_GATHER_UNEVEN,
          REDUCE_SCATTER_SUM, REDUCE_SCATTER_AVG, SEND_RECV_RING, BROADCAST, BARRIER};
}

}  // namespace baton

#endif  // BATON_COMMON_COLLECTIVE_OPS_H_
