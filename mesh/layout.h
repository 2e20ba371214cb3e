// The piece of a global tensor that one rank of a DeviceMesh holds, given one
// Placement per mesh axis: DTensor's local shard. Placements apply in mesh-axis
// order; Shard(d) on axis i splits the extent dimension d has after the
// earlier axes with torch.chunk over that axis (see shard_geometry.h), so
// trailing ranks may hold short or empty pieces. Replicate and Partial leave
// the piece unchanged (a Partial piece is a full-shape addend).
//
//   shape (4, 10), mesh (dp=2), [Shard(1)]:  rank 0 holds [0:4, 0:5], rank 1 [0:4, 5:10]
//   shape (5, 3),  mesh (a=2, b=3), [Shard(0), Shard(0)]:
//       a chunks rows into [0:3) and [3:5); b then chunks each again.
#ifndef BATON_MESH_LAYOUT_H_
#define BATON_MESH_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mesh/device_mesh.h"
#include "mesh/placement.h"

namespace baton {

// A box of a global tensor: its first index and its extent in every dim.
struct Piece {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  int64_t numel() const;
  bool operator==(const Piece& o) const { return offset == o.offset && shape == o.shape; }
  bool operator!=(const Piece& o) const { return !(*this == o); }
  // Whether `inner` lies inside this box.
  bool Contains(const Piece& inner) const;
  std::string ToString() const;
};

// Whether `inner` is a run of whole leading-dim rows of `outer` (equal in
// every other dim): then it is one contiguous part of a row-major tensor
// holding `outer`, and a tensor of `inner` can be a view into it.
bool IsRowRangeOf(const Piece& inner, const Piece& outer);

// Global shape plus one placement per mesh axis. Shard placements apply in
// mesh-axis order unless `order` lists the axes otherwise: FSDP over a
// tensor-parallel weight shards the tp piece, so its layout on (dp, tp) is
// (Shard(0), Shard(0)) with order (tp, dp) (DTensor's strided shard).
struct TensorLayout {
  std::vector<int64_t> shape;
  std::vector<Placement> placements;
  std::vector<int> order;  // mesh axis indices; empty = 0, 1, ...
  std::string ToString() const;
};

// Checks that `layout` fits `mesh`: one placement per axis, Shard dims in
// range, no negative extents.
absl::Status CheckLayout(const TensorLayout& layout, const DeviceMesh& mesh);

// The piece `rank` holds. `layout` must pass CheckLayout.
absl::StatusOr<Piece> LocalPiece(const TensorLayout& layout, const DeviceMesh& mesh, int rank);

// Whether a collective along mesh axis `axis` moves this tensor between the
// two layouts: Shard(d) under `from`, Replicate under `to` (an all-gather
// one way, a reduce-scatter the other).
bool GatheredAlong(const TensorLayout& from, const TensorLayout& to, int axis);

// For a tensor GatheredAlong `axis`: every piece of `rank`'s group along the
// axis under `from`, in group order, each with its offsets relative to
// `rank`'s piece under `to` (where it lands in the gathered tensor).
// INVALID_ARGUMENT when a piece does not lie within that piece or they do
// not cover it, i.e. `to` is not what gathering `from` along `axis` gives.
absl::StatusOr<std::vector<Piece>> GroupPieces(const TensorLayout& from, const TensorLayout& to,
                                               const DeviceMesh& mesh, int rank, int axis);

}  // namespace baton

#endif  // BATON_MESH_LAYOUT_H_
