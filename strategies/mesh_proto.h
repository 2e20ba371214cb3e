// Mesh axes as they arrive on the wire (repeated baton.v1.MeshAxis in
// MeshSpec, Mesh and JobSpec) turned into DeviceMesh's axis list.
#ifndef BATON_STRATEGIES_MESH_PROTO_H_
#define BATON_STRATEGIES_MESH_PROTO_H_

#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "mesh/device_mesh.h"
#include "proto/mesh.pb.h"

namespace baton {

std::vector<MeshAxisSpec> ToMeshAxes(const google::protobuf::RepeatedPtrField<baton::v1::MeshAxis>& axes);

}  // namespace baton

#endif  // BATON_STRATEGIES_MESH_PROTO_H_
