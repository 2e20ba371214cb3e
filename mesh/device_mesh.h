// DeviceMesh: an n-D array of global ranks with named axes, row-major (the
// last axis varies fastest), as torch's init_device_mesh lays them out.
//
//   mesh (dp=2, tp=2):   ranks [[0, 1],      mesh["tp"] groups: {0,1} {2,3}
//                               [2, 3]]      mesh["dp"] groups: {0,2} {1,3}
//
// Immutable after construction; safe to share between threads.
#ifndef BATON_MESH_DEVICE_MESH_H_
#define BATON_MESH_DEVICE_MESH_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

struct MeshAxisSpec {
  std::string name;
  int size = 0;
};

// Parses "dp=2,tp=2" (or "4" for a single axis named "world"). Axis names are
// [a-z_][a-z0-9_]*, unique, and not "world"; sizes are >= 1.
absl::StatusOr<std::vector<MeshAxisSpec>> ParseMeshSpec(absl::string_view text);

// Formats axes back as "dp=2,tp=2".
std::string FormatMeshSpec(const std::vector<MeshAxisSpec>& axes);

class DeviceMesh {
 public:
  // Ranks 0..prod(sizes)-1 laid out row-major.
  static absl::StatusOr<DeviceMesh> Create(std::vector<MeshAxisSpec> axes);

  int ndim() const { return static_cast<int>(axes_.size()); }
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<MeshAxisSpec>& axes() const { return axes_; }
  // Global ranks in row-major order of this mesh's coordinates.
  const std::vector<int>& ranks() const { return ranks_; }
  std::vector<std::string> axis_names() const;

  // Index of the axis called `name`, or NOT_FOUND naming the axes there are.
  absl::StatusOr<int> AxisIndex(absl::string_view name) const;
  absl::StatusOr<int> AxisSize(absl::string_view name) const;

  // Coordinates of a global rank in this mesh; OUT_OF_RANGE if not in it.
  absl::StatusOr<std::vector<int>> Coordinates(int rank) const;
  // Global rank at the given coordinates.
  absl::StatusOr<int> RankAt(const std::vector<int>& coords) const;
  bool Contains(int rank) const;

  // Every group of ranks along `axis`: ranks that differ only in that
  // coordinate, each group ordered by that coordinate. The groups partition
  // the mesh; their order is row-major over the remaining axes.
  absl::StatusOr<std::vector<std::vector<int>>> Groups(absl::string_view axis) const;

  // The 1-D sub-mesh along `axis` that contains `rank` (torch's mesh["tp"]
  // seen from that rank).
  absl::StatusOr<DeviceMesh> Slice(absl::string_view axis, int rank) const;

  // Position of `rank` in its group along `axis` (its coordinate on it).
  absl::StatusOr<int> LocalRank(absl::string_view axis, int rank) const;

  std::string ToString() const;

 private:
  DeviceMesh(std::vector<MeshAxisSpec> axes, std::vector<int> ranks)
      : axes_(std::move(axes)), ranks_(std::move(ranks)) {}

  std::vector<MeshAxisSpec> axes_;
  std::vector<int> ranks_;  // row-major; ranks_[i] is the global rank of cell i
};

}  // namespace baton

#endif  // BATON_MESH_DEVICE_MESH_H_
