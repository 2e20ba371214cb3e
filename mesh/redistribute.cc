#include "mesh/redistribute.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mesh/collective_cost.h"
#include "mesh/shard_geometry.h"

namespace baton {

const char* TransitionName(Transition t) {
  switch (t) {
    case Transition::kNone: return "nothing";
    case Transition::kAllGather: return "all-gather";
    case Transition::kAllReduce: return "all-reduce";
    case Transition::kReduceScatter: return "reduce-scatter";
    case Transition::kLocalChunk: return "local chunk";
    case Transition::kAllToAll: return "all-to-all";
    case Transition::kLocalPartial: return "local (partial)";
  }
  return "?";
}

std::string RedistributePlan::ToString() const {
  return absl::StrCat(from.ToString(), " -> ", to.ToString(), ": ", TransitionName(transition), ", ",
                      bytes_per_rank, " B per rank");
}

absl::StatusOr<RedistributePlan> PlanRedistribute(const std::vector<int64_t>& shape, const Placement& from,
                                                  const Placement& to, int group_size, int64_t elem_bytes) {
  if (group_size < 1) return absl::InvalidArgumentError("a group needs at least one rank");
  for (const Placement* p : {&from, &to}) {
    if (p->is_shard() && (p->dim() < 0 || p->dim() >= static_cast<int>(shape.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(p->ToString(), " is out of range for a tensor of shape [",
                                                     absl::StrJoin(shape, ", "), "]"));
    }
    if (p->is_partial() && p->reduce_op() != ReduceOp::kSum) {
      return absl::InvalidArgumentError(absl::StrCat(p->ToString(), ": only Partial(sum) is redistributed"));
    }
  }
  const int n = group_size;
  // Elements of one rank's padded chunk when sharding `dim`.
  auto chunk = [&](int dim) {
    return ChunkGeometry(shape[dim], n).chunk() * (NumElements(shape) / std::max<int64_t>(1, shape[dim]));
  };
  RedistributePlan plan{from, to, Transition::kNone, 0};
  if (from == to) return plan;
  if (from.is_shard() && to.is_replicate()) {
    plan.transition = Transition::kAllGather;
    plan.bytes_per_rank = shape[from.dim()] == 0 ? 0 : RingAllGatherBytes(chunk(from.dim()), elem_bytes, n);
  } else if (from.is_partial() && to.is_replicate()) {
    plan.transition = Transition::kAllReduce;
    plan.bytes_per_rank = RingAllReduceBytes(NumElements(shape), elem_bytes, n);
  } else if (from.is_partial() && to.is_shard()) {
    plan.transition = Transition::kReduceScatter;
    plan.bytes_per_rank = shape[to.dim()] == 0 ? 0 : RingAllGatherBytes(chunk(to.dim()), elem_bytes, n);
  } else if (from.is_replicate() && to.is_shard()) {
    plan.transition = Transition::kLocalChunk;
  } else if (from.is_shard() && to.is_shard()) {
    plan.transition = Transition::kAllToAll;
    const int64_t rest = NumElements(shape) / std::max<int64_t>(1, shape[from.dim()] * shape[to.dim()]);
    const int64_t block = ChunkGeometry(shape[from.dim()], n).chunk() * ChunkGeometry(shape[to.dim()], n).chunk() *
                          (shape[from.dim()] * shape[to.dim()] == 0 ? 0 : rest);
    plan.bytes_per_rank = RingAllGatherBytes(block, elem_bytes, n);
  } else {  // Replicate or Shard -> Partial
    plan.transition = Transition::kLocalPartial;
  }
  if (n == 1) plan.bytes_per_rank = 0;
  return plan;
}

}  // namespace baton
