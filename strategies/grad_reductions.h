// Where a rank's gradient reductions go in its step, and when they are
// waited for.
//
// A unit's gradients are reduced once its backward has run for every
// microbatch, by a chain of collectives, each needing the one before:
//   REDUCE_SCATTER_GRADS along the shard axis (FSDP, HSDP, ZeRO),
//   ALL_REDUCE_GRADS SUM along the tp axis (sequence parallelism's partial
//     sums of weights applied to sequence shards),
//   ALL_REDUCE_GRADS AVG along the replicate axis (DDP, HSDP's replicas).
// Every collective is asynchronous. With overlap, a reduction in flight is
// waited for (WAIT_GRADS) when the next unit's is issued - it ran while that
// unit's backward computed, as FSDP2 waits for the previous reduce-scatter -
// and its next link is issued then; what is left is completed before the
// step's metrics. Chains that start with an all-reduce are issued for
// buckets of units, each closed once it holds `bucket_bytes` of its units'
// whole gradients (DDP's buckets; the step's first once it holds 1 MiB, as
// DDP's, so reduction starts early): one collective instead of one per unit. Without overlap each collective is
// waited for at once: the same collectives on the same bytes, so the same
// results bit for bit.
//
// The order is fixed by the Program, never by timing: every rank of a group
// issues the group's collectives in the same order.
#ifndef BATON_STRATEGIES_GRAD_REDUCTIONS_H_
#define BATON_STRATEGIES_GRAD_REDUCTIONS_H_

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "models/model.h"
#include "proto/program.pb.h"

namespace baton {

class GradReductions {
 public:
  static constexpr int64_t kFirstBucketBytes = 1 << 20;
  struct Options {
    std::string shard_axis;      // "" when gradients are not sharded
    bool free_grads = true;      // FREE_GRADS once the reduce-scatter has its copy
    std::string partial_axis;    // the tp axis under sequence parallelism, else ""
    std::string replicate_axis;  // "" when there are no replicas
    int64_t bucket_bytes = 0;    // 0: a collective per unit
    bool overlap = true;
  };
  // `partial`: the parameters whose gradients are partial sums along
  // `partial_axis`.
  GradReductions(Options options, const ModelLayout& model, std::set<std::string> partial,
                 baton::v1::Program* program);

  // `unit`'s backward has run for every microbatch.
  void UnitDone(int unit);
  // Before the step's metrics: every reduction issued and waited for.
  void Finish();

 private:
  struct Link {
    baton::v1::Instruction::Op op;
    std::string axis;
    baton::v1::Instruction::Reduce reduce;
    bool operator==(const Link& o) const { return op == o.op && axis == o.axis && reduce == o.reduce; }
  };
  // A bucket (one unit unless bucketed) and the links of its chain not yet
  // issued.
  struct Chain {
    std::vector<int> units;
    std::deque<Link> rest;
  };

  std::deque<Link> LinksOf(int unit) const;
  int64_t GradBytes(int unit) const;
  void Wait(const Chain& chain);
  // Issues `chain`'s next link (after waiting for the one in flight).
  void IssueNext(Chain& chain);
  // Waits for every chain in flight, issuing each one's next link.
  void Advance();
  void Start(Chain chain);
  void FlushBucket();

  const Options options_;
  const ModelLayout& model_;
  const std::set<std::string> partial_;
  baton::v1::Program* const program_;
  std::vector<Chain> in_flight_;
  Chain bucket_;  // being filled
  int64_t bucket_bytes_ = 0;
  int buckets_ = 0;  // flushed so far this step
};

}  // namespace baton

#endif  // BATON_STRATEGIES_GRAD_REDUCTIONS_H_
