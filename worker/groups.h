// The communicators of one rank, looked up by the group an instruction
// names: one mesh axis, or every axis ("world"). Point-to-point peers are
// global ranks, turned into ranks within the axis group here.
//
// Immutable after construction; used by the Executor's thread.
#ifndef BATON_WORKER_GROUPS_H_
#define BATON_WORKER_GROUPS_H_

#include <array>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "mesh/device_mesh.h"
#include "worker/comm/communicator.h"

namespace baton {

using CommunicatorMap = std::map<std::string, std::shared_ptr<Communicator>>;
using AxisNames = google::protobuf::RepeatedPtrField<std::string>;

class Groups {
 public:
  // `comms` maps "world" and every mesh axis to this rank's communicator
  // (worker/comm/mesh_communicators.h).
  Groups(DeviceMesh mesh, int rank, CommunicatorMap comms);

  const DeviceMesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }

  // The communicator of a group, or nullptr for an empty group (nothing to
  // communicate). FAILED_PRECONDITION when the worker has no such
  // communicator.
  absl::StatusOr<Communicator*> Of(const AxisNames& axes) const;
  absl::StatusOr<Communicator*> Axis(const std::string& axis) const;
  // The mesh indices of `axes` (names a checked Program uses).
  std::vector<int> AxisIndices(const AxisNames& axes) const;
  // A global peer's rank within this rank's group along `axis`.
  absl::StatusOr<int> PeerInGroup(const std::string& axis, int peer) const;

  // Bytes sent so far over every communicator, by collective (indexed by
  // CommOp).
  std::array<int64_t, kCommOpCount> bytes_sent_by_op() const;
  int64_t bytes_sent() const;  // their sum
  // Time so far over every communicator: operations in flight, and waited on
  // (worker/comm/communicator.h CommClock).
  struct CommTime {
    double in_flight_ms = 0, waited_ms = 0;
  };
  CommTime comm_time() const;
  // Every communicator's device collectives have run (Communicator::Drain):
  // the one host wait a GPU step makes for its collectives, at its end.
  absl::Status Drain(Milliseconds timeout) const;

 private:
  DeviceMesh mesh_;
  int rank_;
  CommunicatorMap comms_;
};

}  // namespace baton

#endif  // BATON_WORKER_GROUPS_H_
