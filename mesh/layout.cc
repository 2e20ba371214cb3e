#include "mesh/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mesh/shard_geometry.h"

namespace baton {

int64_t Piece::numel() const { return NumElements(shape); }

bool Piece::Contains(const Piece& inner) const {
  if (inner.shape.size() != shape.size() || inner.offset.size() != offset.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (inner.offset[d] < offset[d] || inner.offset[d] + inner.shape[d] > offset[d] + shape[d]) {
      return false;
    }
  }
  return true;
}

bool IsRowRangeOf(const Piece& inner, const Piece& outer) {
  if (!outer.Contains(inner)) return false;
  for (size_t d = 1; d < inner.shape.size(); ++d) {
    if (inner.offset[d] != outer.offset[d] || inner.shape[d] != outer.shape[d]) return false;
  }
  return true;
}

std::string Piece::ToString() const {
  std::vector<std::string> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    dims.push_back(absl::StrCat(offset[d], ":", offset[d] + shape[d]));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string TensorLayout::ToString() const {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ") ",
                      absl::StrJoin(placements, ", ", [](std::string* out, const Placement& p) {
                        absl::StrAppend(out, p.ToString());
                      }),
                      order.empty() ? "" : absl::StrCat(" in axis order ", absl::StrJoin(order, ",")));
}

absl::Status CheckLayout(const TensorLayout& layout, const DeviceMesh& mesh) {
  if (static_cast<int>(layout.placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("layout ", layout.ToString(), " has ",
                                                   layout.placements.size(),
                                                   " placements for a mesh of ", mesh.ndim(), " axes"));
  }
  for (int64_t s : layout.shape) {
    if (s < 0) return absl::InvalidArgumentError(absl::StrCat("layout ", layout.ToString(), " has a negative extent"));
  }
  if (!layout.order.empty()) {
    std::vector<int> sorted = layout.order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < static_cast<int>(sorted.size()); ++i) {
      if (sorted.size() != layout.placements.size() || sorted[i] != i) {
        return absl::InvalidArgumentError(absl::StrCat("layout ", layout.ToString(),
                                                       ": the shard order is not a permutation of the mesh axes"));
      }
    }
  }
  for (const Placement& p : layout.placements) {
    if (p.is_shard() && (p.dim() < 0 || p.dim() >= static_cast<int>(layout.shape.size()))) {
      return absl::InvalidArgumentError(absl::StrCat("layout ", layout.ToString(), ": ", p.ToString(),
                                                     " is out of range for a ", layout.shape.size(),
                                                     "-d tensor"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Piece> LocalPiece(const TensorLayout& layout, const DeviceMesh& mesh, int rank) {
  if (auto s = CheckLayout(layout, mesh); !s.ok()) return s;
  auto coords = mesh.Coordinates(rank);
  if (!coords.ok()) return coords.status();
  Piece piece;
  piece.offset.assign(layout.shape.size(), 0);
  piece.shape = layout.shape;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const int axis = layout.order.empty() ? i : layout.order[i];
    const Placement& p = layout.placements[axis];
    if (!p.is_shard()) continue;
    ChunkGeometry g(piece.shape[p.dim()], mesh.axes()[axis].size);
    piece.offset[p.dim()] += g.offset((*coords)[axis]);
    piece.shape[p.dim()] = g.length((*coords)[axis]);
  }
  return piece;
}

bool GatheredAlong(const TensorLayout& from, const TensorLayout& to, int axis) {
  return axis >= 0 && axis < static_cast<int>(from.placements.size()) &&
         axis < static_cast<int>(to.placements.size()) && from.placements[axis].is_shard() &&
         to.placements[axis].is_replicate();
}

absl::StatusOr<std::vector<Piece>> GroupPieces(const TensorLayout& from, const TensorLayout& to,
                                               const DeviceMesh& mesh, int rank, int axis) {
  auto whole = LocalPiece(to, mesh, rank);
  if (!whole.ok()) return whole.status();
  auto coords = mesh.Coordinates(rank);
  if (!coords.ok()) return coords.status();
  std::vector<Piece> pieces;
  int64_t covered = 0;
  for (int r = 0; r < mesh.axes()[axis].size; ++r) {
    (*coords)[axis] = r;
    auto piece = LocalPiece(from, mesh, *mesh.RankAt(*coords));
    if (!piece.ok()) return piece.status();
    if (!whole->Contains(*piece)) {
      return absl::InvalidArgumentError(absl::StrCat("the piece ", piece->ToString(), " of rank ", r, " along \"",
                                                     mesh.axes()[axis].name, "\" is not part of ",
                                                     whole->ToString()));
    }
    covered += piece->numel();
    for (size_t d = 0; d < piece->offset.size(); ++d) piece->offset[d] -= whole->offset[d];
    pieces.push_back(std::move(*piece));
  }
  if (covered != whole->numel()) {
    return absl::InvalidArgumentError(absl::StrCat("the pieces along \"", mesh.axes()[axis].name, "\" cover ",
                                                   covered, " of the ", whole->numel(), " elements of ",
                                                   whole->ToString()));
  }
  return pieces;
}

}  // namespace baton
