#include "mesh/device_mesh.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace baton {
namespace {

// Large enough for any fleet we schedule; keeps products from overflowing.
constexpr int64_t kMaxMeshSize = 1 << 20;

bool ValidAxisName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (!(name[0] == '_' || (name[0] >= 'a' && name[0] <= 'z'))) return false;
  for (char c : name) {
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<MeshAxisSpec>> ParseMeshSpec(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) {
    return absl::InvalidArgumentError("empty mesh spec; expected e.g. \"dp=2,tp=2\"");
  }
  std::vector<MeshAxisSpec> axes;
  int single = 0;
  if (absl::SimpleAtoi(text, &single)) {
    axes.push_back({"world", single});
  } else {
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      std::vector<absl::string_view> kv = absl::StrSplit(part, '=');
      int size = 0;
      if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed mesh axis \"", part, "\" in \"", text,
            "\"; expected NAME=SIZE, e.g. \"dp=2,tp=2\""));
      }
      axes.push_back({std::string(absl::StripAsciiWhitespace(kv[0])), size});
    }
  }
  // Validation is shared with DeviceMesh::Create.
  auto mesh = DeviceMesh::Create(axes);
  if (!mesh.ok()) return mesh.status();
  return axes;
}

std::string FormatMeshSpec(const std::vector<MeshAxisSpec>& axes) {
  return absl::StrJoin(axes, ",", [](std::string* out, const MeshAxisSpec& a) {
    absl::StrAppend(out, a.name, "=", a.size);
  });
}

absl::StatusOr<DeviceMesh> DeviceMesh::Create(std::vector<MeshAxisSpec> axes) {
  if (axes.empty()) return absl::InvalidArgumentError("a mesh needs at least one axis");
  std::set<std::string> seen;
  int64_t total = 1;
  for (const MeshAxisSpec& a : axes) {
    bool single_world = axes.size() == 1 && a.name == "world";
    if (!single_world && (!ValidAxisName(a.name) || a.name == "world")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid mesh axis name \"", a.name,
          "\": use lower-case letters, digits and '_' (\"world\" is reserved)"));
    }
    if (!seen.insert(a.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("mesh axis \"", a.name, "\" appears twice"));
    }
    if (a.size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh axis \"", a.name, "\" has size ", a.size, "; sizes must be >= 1"));
    }
    total *= a.size;
    if (total > kMaxMeshSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh has more than ", kMaxMeshSize, " ranks"));
    }
  }
  std::vector<int> ranks(static_cast<size_t>(total));
  for (int i = 0; i < total; ++i) ranks[i] = i;
  return DeviceMesh(std::move(axes), std::move(ranks));
}

std::vector<std::string> DeviceMesh::axis_names() const {
  std::vector<std::string> names;
  for (const auto& a : axes_) names.push_back(a.name);
  return names;
}

absl::StatusOr<int> DeviceMesh::AxisIndex(absl::string_view name) const {
  for (int i = 0; i < ndim(); ++i) {
    if (axes_[i].name == name) return i;
  }
  return absl::NotFoundError(absl::StrCat("unknown mesh axis \"", name, "\"; this mesh has axes [",
                                          absl::StrJoin(axis_names(), ", "), "]"));
}

absl::StatusOr<int> DeviceMesh::AxisSize(absl::string_view name) const {
  auto index = AxisIndex(name);
  if (!index.ok()) return index.status();
  return axes_[*index].size;
}

bool DeviceMesh::Contains(int rank) const {
  return std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end();
}

absl::StatusOr<std::vector<int>> DeviceMesh::Coordinates(int rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end()) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is not in mesh ", ToString()));
  }
  int cell = static_cast<int>(it - ranks_.begin());
  std::vector<int> coords(ndim());
  for (int d = ndim() - 1; d >= 0; --d) {
    coords[d] = cell % axes_[d].size;
    cell /= axes_[d].size;
  }
  return coords;
}

absl::StatusOr<int> DeviceMesh::RankAt(const std::vector<int>& coords) const {
  if (static_cast<int>(coords.size()) != ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", ndim(), " coordinates, got ", coords.size()));
  }
  int cell = 0;
  for (int d = 0; d < ndim(); ++d) {
    if (coords[d] < 0 || coords[d] >= axes_[d].size) {
      return absl::OutOfRangeError(absl::StrCat("coordinate ", coords[d], " out of range for axis \"",
                                                axes_[d].name, "\" of size ", axes_[d].size));
    }
    cell = cell * axes_[d].size + coords[d];
  }
  return ranks_[cell];
}

absl::StatusOr<std::vector<std::vector<int>>> DeviceMesh::Groups(absl::string_view axis) const {
  auto index = AxisIndex(axis);
  if (!index.ok()) return index.status();
  const int d = *index;
  std::vector<std::vector<int>> groups;
  // Walk all cells whose coordinate on `d` is 0; each starts one group.
  for (int cell = 0; cell < size(); ++cell) {
    auto coords = Coordinates(ranks_[cell]);
    if ((*coords)[d] != 0) continue;
    std::vector<int> group;
    for (int k = 0; k < axes_[d].size; ++k) {
      (*coords)[d] = k;
      group.push_back(*RankAt(*coords));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

absl::StatusOr<DeviceMesh> DeviceMesh::Slice(absl::string_view axis, int rank) const {
  auto groups = Groups(axis);
  if (!groups.ok()) return groups.status();
  if (!Contains(rank)) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " is not in mesh ", ToString()));
  }
  for (auto& g : *groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) {
      int d = *AxisIndex(axis);
      return DeviceMesh({axes_[d]}, std::move(g));
    }
  }
  return absl::InternalError("rank not found in any group");  // unreachable
}

absl::StatusOr<int> DeviceMesh::LocalRank(absl::string_view axis, int rank) const {
  auto index = AxisIndex(axis);
  if (!index.ok()) return index.status();
  auto coords = Coordinates(rank);
  if (!coords.ok()) return coords.status();
  return (*coords)[*index];
}

std::string DeviceMesh::ToString() const {
  return absl::StrCat("DeviceMesh(", FormatMeshSpec(axes_), "; ranks [",
                      absl::StrJoin(ranks_, ","), "])");
}

}  // namespace baton
