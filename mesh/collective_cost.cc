#include "mesh/collective_cost.h"

#include <algorithm>

#include "mesh/shard_geometry.h"

namespace baton {

int64_t RingAllGatherBytes(int64_t chunk_numel, int64_t elem_bytes, int size) {
  return chunk_numel * elem_bytes * (size - 1);
}

int64_t RingAllReduceBytes(int64_t numel, int64_t elem_bytes, int size) {
  ChunkGeometry g(numel, size);
  return 2 * RingAllGatherBytes(g.chunk(), elem_bytes, size);
}

int64_t ReduceScatterChunkNumel(int64_t block_numel, int64_t elem_bytes) {
  const int64_t most = std::max<int64_t>(1, kReduceScatterChunkBytes / std::max<int64_t>(1, elem_bytes));
  return std::min(block_numel, most);
}

int64_t ReduceScatterStagingBytes(int64_t block_numel, int64_t elem_bytes, int size) {
  return size <= 1 ? 0 : 2 * ReduceScatterChunkNumel(block_numel, elem_bytes) * elem_bytes;
}

int64_t SharedSegmentBytes(int64_t largest_input) {
  constexpr int64_t kPage = 4096;
  const int64_t grown = std::min(kSharedHalfMostBytes, (largest_input + kPage - 1) / kPage * kPage);
  return kSharedControlBytes + 2 * std::max(kSharedHalfFirstBytes, grown);
}

}  // namespace baton
