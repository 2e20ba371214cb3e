#include "strategies/mesh_proto.h"

namespace baton {

std::vector<MeshAxisSpec> ToMeshAxes(const google::protobuf::RepeatedPtrField<baton::v1::MeshAxis>& axes) {
  std::vector<MeshAxisSpec> out;
  for (const auto& a : axes) out.push_back({a.name(), a.size()});
  return out;
}

}  // namespace baton
