// FleetMonitor: the controller's one background thread. Every sweep it
// marks workers that stopped heartbeating DEAD (WorkerRegistry), aborts the
// meshes that hold them (MeshManager, which tells their jobs), lets the job
// manager tick (lapsed leases, the queue, finished runners), and once a
// second gives back to the system what a burst of calls left in the
// allocator's arenas. Detection takes at most heartbeat_timeout + sweep.
#ifndef BATON_CONTROLLER_FLEET_MONITOR_H_
#define BATON_CONTROLLER_FLEET_MONITOR_H_

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "controller/job_manager.h"
#include "controller/mesh_manager.h"
#include "controller/worker_registry.h"

namespace baton {

class FleetMonitor {
 public:
  static constexpr absl::Duration kTrimInterval = absl::Seconds(1);

  FleetMonitor(WorkerRegistry* registry, MeshManager* meshes, JobManager* jobs,
               absl::Duration sweep_interval = absl::Milliseconds(200))
      : registry_(registry), meshes_(meshes), jobs_(jobs), sweep_interval_(sweep_interval) {}
  ~FleetMonitor() { Stop(); }

  void Start();
  void Stop();
  // One sweep (tests call it with their own clock).
  void Sweep();

 private:
  WorkerRegistry* const registry_;
  MeshManager* const meshes_;
  JobManager* const jobs_;
  const absl::Duration sweep_interval_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_CONTROLLER_FLEET_MONITOR_H_
