// Conversions between the wire messages (proto/) and mesh/'s types, in one
// place that the planner, the controller, the worker and the CLI all use.
#ifndef BATON_PROGRAM_WIRE_H_
#define BATON_PROGRAM_WIRE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "mesh/device_mesh.h"
#include "mesh/layout.h"
#include "mesh/placement.h"
#include "proto/mesh.pb.h"
#include "proto/program.pb.h"

namespace baton {

// The most steps one RunStep may ask a worker for (RunStepRequest.steps):
// the controller asks for at most this many, the worker refuses more.
inline constexpr int kMaxStepsPerRunStep = 10000;

using WireAxes = google::protobuf::RepeatedPtrField<baton::v1::MeshAxis>;
using WirePlacements = google::protobuf::RepeatedPtrField<baton::v1::Placement>;

std::vector<MeshAxisSpec> ToMeshAxes(const WireAxes& axes);
absl::StatusOr<DeviceMesh> ToDeviceMesh(const WireAxes& axes);

baton::v1::Placement ToWire(const Placement& p);
// INVALID_ARGUMENT for a kind no name stands for or a negative dim.
absl::StatusOr<Placement> FromWire(const baton::v1::Placement& p);
absl::StatusOr<std::vector<Placement>> FromWire(const WirePlacements& placements);

// A parameter's two layouts on `mesh`: its master/gradient/optimizer pieces
// and its compute tensor.
absl::StatusOr<TensorLayout> StorageLayout(const baton::v1::ParamLayout& param, const DeviceMesh& mesh);
absl::StatusOr<TensorLayout> ComputeLayout(const baton::v1::ParamLayout& param, const DeviceMesh& mesh);

}  // namespace baton

#endif  // BATON_PROGRAM_WIRE_H_
