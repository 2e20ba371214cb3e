#include "program/wire.h"

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

absl::StatusOr<TensorLayout> Layout(const baton::v1::ParamLayout& param, const WirePlacements& placements,
                                    const DeviceMesh& mesh) {
  auto p = FromWire(placements);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrCat(param.name(), ": ", p.status().message()));
  }
  TensorLayout layout{{param.shape().begin(), param.shape().end()}, std::move(*p), {}};
  for (const std::string& axis : param.shard_order()) {
    auto index = mesh.AxisIndex(axis);
    if (!index.ok()) return absl::InvalidArgumentError(absl::StrCat(param.name(), ": shard order: ", index.status().message()));
    layout.order.push_back(*index);
  }
  return layout;
}

}  // namespace

std::vector<MeshAxisSpec> ToMeshAxes(const WireAxes& axes) {
  std::vector<MeshAxisSpec> out;
  for (const auto& a : axes) out.push_back({a.name(), a.size()});
  return out;
}

absl::StatusOr<DeviceMesh> ToDeviceMesh(const WireAxes& axes) { return DeviceMesh::Create(ToMeshAxes(axes)); }

baton::v1::Placement ToWire(const Placement& p) {
  baton::v1::Placement out;
  switch (p.kind()) {
    case Placement::Kind::kShard:
      out.set_kind(baton::v1::Placement::SHARD);
      out.set_dim(p.dim());
      break;
    case Placement::Kind::kReplicate:
      out.set_kind(baton::v1::Placement::REPLICATE);
      break;
    case Placement::Kind::kPartial:
      out.set_kind(baton::v1::Placement::PARTIAL);
      break;
  }
  return out;
}

absl::StatusOr<Placement> FromWire(const baton::v1::Placement& p) {
  switch (p.kind()) {
    case baton::v1::Placement::SHARD:
      if (p.dim() < 0) return absl::InvalidArgumentError(absl::StrCat("Shard(", p.dim(), ") has a negative dim"));
      return Placement::Shard(p.dim());
    case baton::v1::Placement::REPLICATE:
      return Placement::Replicate();
    case baton::v1::Placement::PARTIAL:
      return Placement::Partial(ReduceOp::kSum);
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown placement kind ", p.kind()));
  }
}

absl::StatusOr<std::vector<Placement>> FromWire(const WirePlacements& placements) {
  std::vector<Placement> out;
  for (const auto& p : placements) {
    auto placement = FromWire(p);
    if (!placement.ok()) return placement.status();
    out.push_back(*placement);
  }
  return out;
}

absl::StatusOr<TensorLayout> StorageLayout(const baton::v1::ParamLayout& param, const DeviceMesh& mesh) {
  return Layout(param, param.placements(), mesh);
}

absl::StatusOr<TensorLayout> ComputeLayout(const baton::v1::ParamLayout& param, const DeviceMesh& mesh) {
  return Layout(param, param.compute_placements(), mesh);
}

}  // namespace baton
