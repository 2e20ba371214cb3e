#include "mesh/shard_geometry.h"

#include <algorithm>


namespace baton {

ChunkGeometry::ChunkGeometry(int64_t extent, int world)
    : extent_(extent), world_(world), chunk_(world > 0 ? (extent + world - 1) / world : 0) {}

int64_t ChunkGeometry::offset(int rank) const { return std::min<int64_t>(rank * chunk_, extent_); }

int64_t ChunkGeometry::length(int rank) const {
  return std::max<int64_t>(0, std::min<int64_t>(chunk_, extent_ - rank * chunk_));
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace baton
