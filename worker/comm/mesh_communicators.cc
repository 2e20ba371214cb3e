#include "worker/comm/mesh_communicators.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<MeshCommunicators> BuildMeshCommunicators(const DeviceMesh& mesh, int rank,
                                                         const std::string& key_prefix,
                                                         const CommunicatorFactory& create) {
  if (!mesh.Contains(rank)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in ", mesh.ToString()));
  }
  MeshCommunicators out;
  auto world = create(key_prefix + "world/", rank, mesh.size());
  if (!world.ok()) return world.status();
  out.comms["world"] = std::move(*world);
  out.group_ranks["world"] = mesh.ranks();
  for (const auto& axis : mesh.axes()) {
    auto groups = *mesh.Groups(axis.name);
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), rank);
      if (it == groups[g].end()) continue;
      auto comm = create(absl::StrCat(key_prefix, axis.name, "/", g, "/"),
                         static_cast<int>(it - groups[g].begin()), axis.size);
      if (!comm.ok()) return comm.status();
      out.comms[axis.name] = std::move(*comm);
      out.group_ranks[axis.name] = groups[g];
    }
  }
  return out;
}

}  // namespace baton
