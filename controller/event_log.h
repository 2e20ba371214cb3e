// EventLog: what happened in the fleet, in order (registrations, deaths,
// meshes, checks, jobs, checkpoints), as typed events (proto EventKind with
// structured fields) for `Watch` streams, the status page and for explaining
// failures. Each event is also written to the controller's log.
// Thread-safe; keeps the most recent kCapacity events.
#ifndef BATON_CONTROLLER_EVENT_LOG_H_
#define BATON_CONTROLLER_EVENT_LOG_H_

#include <string>

#include "controller/sequenced_log.h"
#include "proto/controller.pb.h"
#include "proto/mesh.pb.h"

namespace baton {

class EventLog : public SequencedLog<baton::v1::Event> {
 public:
  // Enough to explain any failure and to start a Watch (1,000), small
  // enough that a flood of registrations (each an event) costs little
  // memory. Per event at most ~2.5 KiB held.
  static constexpr size_t kCapacity = 4096;
  static constexpr size_t kMaxMessageBytes = 1024;
  static constexpr size_t kMaxNameBytes = 128;

  EventLog() : SequencedLog(kCapacity) {}

  // Bounds every string of `e` (a name or cause someone sent is cut at a
  // UTF-8 boundary, not copied whole), logs it, numbers and keeps it.
  void Append(baton::v1::Event e);
};

// Events about a worker, a mesh and a job; `rank` is the worker's fleet rank.
baton::v1::Event WorkerEvent(baton::v1::Event::Kind kind, const std::string& worker, int rank, const std::string& detail);
baton::v1::Event MeshEvent(baton::v1::Event::Kind kind, const baton::v1::Mesh& mesh, const std::string& cause);
baton::v1::Event JobEvent(baton::v1::Event::Kind kind, const std::string& job_id, int step, const std::string& detail,
                          const std::string& cause = "");

// "KIND worker=W job=J mesh=M step=S: DETAIL (cause: C)", for logs.
std::string DescribeEvent(const baton::v1::Event& e);

}  // namespace baton

#endif  // BATON_CONTROLLER_EVENT_LOG_H_
