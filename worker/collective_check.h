// The collective self-test behind `baton check`: runs each collective on one
// communicator and checks the result against an expectation computed locally.
// Inputs are deterministic in (group rank, element index), so every rank can
// compute what every other rank contributed without communicating:
//   value(r, i) = (r + 1) * 1000 + (i mod 977)      (exact in fp32)
#ifndef BATON_WORKER_COLLECTIVE_CHECK_H_
#define BATON_WORKER_COLLECTIVE_CHECK_H_

#include <functional>
#include <string>
#include <vector>

#include "common/collective_ops.h"
#include "proto/collective.pb.h"
#include "worker/comm/communicator.h"

namespace baton {

struct CollectiveCheckOptions {
  std::vector<baton::v1::CollectiveOp> ops;  // empty = all
  int64_t numel = 1 << 20;                   // P
  int iters = 3;
  Milliseconds timeout = kDefaultCollectiveTimeout;
  std::string axis;
  int global_rank = 0;
  std::vector<int> group_ranks;  // global ranks of the group, in group order
  // Checked between iterations: true ends the check (the RPC was cancelled
  // or the mesh aborted); what did not run is reported as failed.
  std::function<bool()> should_stop;
};

// Every operation in `options.ops` (or all), in order. After the first
// failure the group is broken, so the remaining operations are reported as
// failed without being issued.
std::vector<baton::v1::CollectiveResult> RunCollectiveChecks(
    Communicator& comm, const CollectiveCheckOptions& options);

}  // namespace baton

#endif  // BATON_WORKER_COLLECTIVE_CHECK_H_
