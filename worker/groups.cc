#include "worker/groups.h"

#include "absl/strings/str_cat.h"
#include "program/program_check.h"

namespace baton {

Groups::Groups(DeviceMesh mesh, int rank, CommunicatorMap comms)
    : mesh_(std::move(mesh)), rank_(rank), comms_(std::move(comms)) {}

std::vector<int> Groups::AxisIndices(const AxisNames& axes) const {
  std::vector<int> indices;
  for (const std::string& a : axes) indices.push_back(*mesh_.AxisIndex(a));
  return indices;
}

absl::StatusOr<Communicator*> Groups::Axis(const std::string& axis) const {
  auto it = comms_.find(axis);
  if (it == comms_.end() || it->second == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("no communicator for mesh axis \"", axis, "\""));
  }
  return it->second.get();
}

absl::StatusOr<Communicator*> Groups::Of(const AxisNames& axes) const {
  auto key = GroupCommunicator(mesh_, axes);
  if (!key.ok()) return key.status();
  if (key->empty()) return nullptr;
  return Axis(*key);
}

absl::StatusOr<int> Groups::PeerInGroup(const std::string& axis, int peer) const {
  return mesh_.LocalRank(axis, peer);
}

std::array<int64_t, kCommOpCount> Groups::bytes_sent_by_op() const {
  std::array<int64_t, kCommOpCount> sent{};
  for (const auto& [name, comm] : comms_) {
    const CommStats stats = comm->stats();
    for (int i = 0; i < kCommOpCount; ++i) sent[i] += stats.bytes_sent_by_op[i];
  }
  return sent;
}

int64_t Groups::bytes_sent() const {
  int64_t sent = 0;
  for (const int64_t b : bytes_sent_by_op()) sent += b;
  return sent;
}

absl::Status Groups::Drain(Milliseconds timeout) const {
  for (const auto& [name, comm] : comms_) {
    if (absl::Status s = comm->Drain(timeout); !s.ok()) return s;
  }
  return absl::OkStatus();
}

Groups::CommTime Groups::comm_time() const {
  CommTime t;
  for (const auto& [name, comm] : comms_) {
    t.in_flight_ms += comm->clock().in_flight_ms();
    t.waited_ms += comm->clock().waited_ms();
  }
  return t;
}

}  // namespace baton
