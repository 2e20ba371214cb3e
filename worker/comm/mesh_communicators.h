// The communicators one rank of a DeviceMesh needs: "world" (the whole mesh)
// and, for every mesh axis, the group along that axis containing the rank.
// Every rank creates them in the same order (world, then the axes in mesh
// order), so the rendezvous of one group never waits on another.
#ifndef BATON_WORKER_COMM_MESH_COMMUNICATORS_H_
#define BATON_WORKER_COMM_MESH_COMMUNICATORS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mesh/device_mesh.h"
#include "worker/comm/communicator.h"

namespace baton {

// Creates the communicator of one group: (key prefix, rank in group, size).
using CommunicatorFactory = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    const std::string& key_prefix, int rank, int size)>;

struct MeshCommunicators {
  std::map<std::string, std::shared_ptr<Communicator>> comms;  // "world" and axes
  std::map<std::string, std::vector<int>> group_ranks;         // global ranks per group
};

// `key_prefix` must be unique per mesh (e.g. "mesh/<epoch>/").
absl::StatusOr<MeshCommunicators> BuildMeshCommunicators(const DeviceMesh& mesh, int rank,
                                                         const std::string& key_prefix,
                                                         const CommunicatorFactory& create);

}  // namespace baton

#endif  // BATON_WORKER_COMM_MESH_COMMUNICATORS_H_
