// redistribute, as DTensor does it, along one mesh axis: every change of a
// tensor's placement there is one collective or a local step, chosen here
// (no data), run by the worker (worker/redistribute.h), and both count the
// same bytes.
//
//   Shard(d)  -> Replicate   all-gather       (n-1) * chunk         per rank
//   Partial   -> Replicate   all-reduce       2 (n-1) * ceil(P/n)
//   Partial   -> Shard(d)    reduce-scatter   (n-1) * chunk
//   Replicate -> Shard(d)    local chunk      0
//   Shard(i)  -> Shard(j)    all-to-all       (n-1) * chunk_i * chunk_j * rest
//   Replicate -> Partial     local            0  (rank 0 keeps the value, the others
//                                                 hold zeros: exact, unlike dividing by n)
//   Shard(d)  -> Partial     local            0  (own chunk in place, zeros elsewhere)
// in elements of the tensor's dtype, chunk = ceil(extent / n) x the other
// dims (torch.chunk geometry, uneven pieces padded on the wire).
#ifndef BATON_MESH_REDISTRIBUTE_H_
#define BATON_MESH_REDISTRIBUTE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mesh/placement.h"

namespace baton {

enum class Transition {
  kNone,
  kAllGather,
  kAllReduce,
  kReduceScatter,
  kLocalChunk,
  kAllToAll,
  kLocalPartial,  // Replicate or Shard -> Partial
};

const char* TransitionName(Transition t);

struct RedistributePlan {
  Placement from, to;
  Transition transition = Transition::kNone;
  int64_t bytes_per_rank = 0;  // sent by each rank (the largest piece's, padding included)
  std::string ToString() const;
};

// `shape`: the tensor as the ranks of the axis see it together (its piece
// along every other mesh axis); `group_size` ranks along the axis.
absl::StatusOr<RedistributePlan> PlanRedistribute(const std::vector<int64_t>& shape, const Placement& from,
                                                  const Placement& to, int group_size, int64_t elem_bytes);

}  // namespace baton

#endif  // BATON_MESH_REDISTRIBUTE_H_
