// Shard geometry with exactly torch.chunk's semantics, as FSDP2 and DTensor
// use for Shard(dim):
//   chunk = ceil(n / world); rank r holds [min(r*chunk, n), min((r+1)*chunk, n))
// so trailing ranks may hold a short or an EMPTY chunk (n=1 over 2 ranks:
// rank 1 holds nothing). Collectives need equal sizes, so every rank's piece
// is padded to `chunk` rows for all-gather and reduce-scatter; the padding is
// part of the bytes on the wire.
#ifndef BATON_MESH_SHARD_GEOMETRY_H_
#define BATON_MESH_SHARD_GEOMETRY_H_

#include <cstdint>
#include <vector>


namespace baton {

// Splitting one dimension of `extent` along a group of `world` ranks.
class ChunkGeometry {
 public:
  ChunkGeometry(int64_t extent, int world);

  int64_t extent() const { return extent_; }
  int world() const { return world_; }
  // Uniform padded chunk size, ceil(extent / world).
  int64_t chunk() const { return chunk_; }
  // First index and length of rank r's chunk (length may be 0).
  int64_t offset(int rank) const;
  int64_t length(int rank) const;
  // Total padded extent, chunk * world.
  int64_t padded_extent() const { return chunk_ * world_; }

 private:
  int64_t extent_;
  int world_;
  int64_t chunk_;
};

int64_t NumElements(const std::vector<int64_t>& shape);

}  // namespace baton

#endif  // BATON_MESH_SHARD_GEOMETRY_H_
