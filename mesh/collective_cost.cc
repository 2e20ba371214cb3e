#include "mesh/collective_cost.h"

#include "mesh/shard_geometry.h"

namespace baton {

int64_t RingAllGatherBytes(int64_t chunk_numel, int64_t elem_bytes, int size) {
  return chunk_numel * elem_bytes * (size - 1);
}

int64_t RingAllReduceBytes(int64_t numel, int64_t elem_bytes, int size) {
  ChunkGeometry g(numel, size);
  return 2 * RingAllGatherBytes(g.chunk(), elem_bytes, size);
}

}  // namespace baton
