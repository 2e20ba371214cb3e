// Collectives on whole units: gathering a unit's parameters for compute and
// reducing its gradients into pieces, with one packing for every direction.
//
// A collective along one mesh axis of n ranks moves a rank-major buffer of n
// blocks: block r holds rank r's master piece of every parameter of the unit
// that is sharded on that axis, each padded to the largest piece of the group
// (torch.chunk leaves trailing ranks short or empty; the padding is part of
// the bytes on the wire). Where a piece sits inside the compute tensor follows
// from the layouts (mesh/layout.h), so Shard(0) rows, Shard(1) columns and
// nested shards pack the same way.
//
//   GATHER   own master piece (cast to the compute dtype) -> own block;
//            all-gather; block r -> rank r's region of `full`
//   REDUCE_SCATTER  rank r's region of `full_grad` -> block r; reduce-scatter
//            (AVG = SUM, then our division); own block added to `grad`
//   ALL_REDUCE  the gradient pieces of a unit, or of a bucket of units, flat
//            (AVG over replicas, or SUM of sequence-parallel partial sums)
//
// Every collective is asynchronous: GATHER issues, WAIT completes; a
// reduction is issued by REDUCE_SCATTER / ALL_REDUCE and its result lands
// in the gradient pieces at WaitGrads (WAIT_GRADS), which the planner places
// (strategies/grad_reductions.h). A unit has at most one reduction in flight.
//
// Not thread-safe: the Executor's thread drives it; the collectives run on
// the communicators' threads.
#ifndef BATON_WORKER_UNIT_COLLECTIVES_H_
#define BATON_WORKER_UNIT_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/groups.h"
#include "worker/shard_store.h"

namespace baton {

class UnitCollectives {
 public:
  UnitCollectives(ShardStore* store, const Groups* groups);
  ~UnitCollectives();

  // `axes` is empty (a local copy, e.g. a cast) or one mesh axis.
  absl::Status Gather(ShardStore::Unit& unit, const AxisNames& axes, Milliseconds timeout);
  absl::Status WaitGather(ShardStore::Unit& unit);
  absl::Status ReduceScatterGrads(ShardStore::Unit& unit, const AxisNames& axes, Milliseconds timeout);
  // One collective over the units (a bucket), flat in their order. kAvg:
  // the pieces of parameters Replicate along `axes` (data-parallel
  // replicas); kSum: those whose gradients are partial along them.
  absl::Status AllReduceGrads(const std::vector<ShardStore::Unit*>& units, const AxisNames& axes, ReduceOp op,
                              Milliseconds timeout);
  // Completes the reduction in flight that holds `unit` (its whole bucket).
  absl::Status WaitGrads(const ShardStore::Unit& unit);
  // Completes every reduction issued so far; the first failure, if any.
  absl::Status WaitReductions();
  // Completes and forgets every gather not waited for (after a failed step);
  // FAILED_PRECONDITION naming one if there was any.
  absl::Status DropGathers();

 private:
  // Where each rank's piece of each sharded parameter lies, for one unit and
  // one axis.
  class Packing;
  struct InFlightGather;
  struct Pending {
    std::unique_ptr<CommHandle> handle;
    std::function<void()> finish;
    std::vector<int> units;
  };

  // FAILED_PRECONDITION when a reduction of `unit` is in flight.
  absl::Status NoneInFlight(const ShardStore::Unit& unit) const;
  // Waits for `pending` and applies its result.
  static absl::Status Complete(Pending& pending);
  // The packing of `unit` along `axis`, worked out on first use: layouts
  // never change after load, and steps must not pay for it again.
  absl::StatusOr<std::shared_ptr<const Packing>> PackingOf(ShardStore::Unit& unit, const std::string& axis);

  ShardStore* const store_;
  const Groups* const groups_;
  std::map<int, std::unique_ptr<InFlightGather>> gathers_;
  std::map<std::pair<int, std::string>, std::shared_ptr<const Packing>> packings_;
  std::vector<Pending> pending_;
};

}  // namespace baton

#endif  // BATON_WORKER_UNIT_COLLECTIVES_H_
