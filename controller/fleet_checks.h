// The collective check (`baton check`): a mesh formed on free workers -
// beside running jobs, which keep theirs - and along every axis each
// collective run and compared bit for bit with what every worker expects.
// The mesh stays formed, idle, until its workers are needed.
#ifndef BATON_CONTROLLER_FLEET_CHECKS_H_
#define BATON_CONTROLLER_FLEET_CHECKS_H_

#include <string>

#include "absl/status/statusor.h"
#include "controller/mesh_manager.h"
#include "proto/controller.pb.h"

namespace baton {

// Validates `req` before touching a worker; `owner` names the check while
// it holds its workers.
absl::StatusOr<baton::v1::CheckCollectivesResponse> RunFleetCheck(MeshManager& meshes, EventLog& events,
                                                                  const baton::v1::CheckCollectivesRequest& req,
                                                                  const std::string& owner);
// Forms a mesh on free workers and leaves it idle (CreateMesh).
absl::StatusOr<baton::v1::Mesh> FormIdleMesh(MeshManager& meshes, const baton::v1::MeshSpec& spec,
                                            baton::v1::CommBackend backend, const std::string& owner);

}  // namespace baton

#endif  // BATON_CONTROLLER_FLEET_CHECKS_H_
