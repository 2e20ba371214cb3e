#include "mesh/shard_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

absl::StatusOr<ShardSpec> ComputeShard(const std::vector<int64_t>& shape, int dim, int world,
                                       int rank) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world size ", world, " < 1"));
  if (rank < 0 || rank >= world) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " out of range for world ", world));
  }
  if (shape.empty()) {
    return absl::InvalidArgumentError("cannot Shard a 0-d tensor; use Replicate()");
  }
  if (dim < 0 || dim >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat("Shard(", dim, ") out of range for shape [",
                                                   absl::StrJoin(shape, ", "), "]"));
  }
  for (int64_t s : shape) {
    if (s < 0) return absl::InvalidArgumentError("negative dimension in shape");
  }
  ChunkGeometry g(shape[dim], world);
  ShardSpec spec;
  spec.global_shape = shape;
  spec.dim = dim;
  spec.world = world;
  spec.rank = rank;
  spec.local_shape = shape;
  spec.local_shape[dim] = g.length(rank);
  spec.padded_shape = shape;
  spec.padded_shape[dim] = g.chunk();
  spec.offset = g.offset(rank);
  spec.local_numel = NumElements(spec.local_shape);
  spec.padded_numel = NumElements(spec.padded_shape);
  return spec;
}

}  // namespace baton
