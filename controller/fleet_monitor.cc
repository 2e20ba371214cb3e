#include "controller/fleet_monitor.h"

#include <malloc.h>

#include "absl/time/clock.h"

namespace baton {

void FleetMonitor::Start() {
  thread_ = std::thread([this] {
    absl::Time last_trim = absl::Now();
    while (!stop_.WaitForNotificationWithTimeout(sweep_interval_)) {
      Sweep();
      // What a burst of calls (a flood of streams or values) left in the
      // allocator's arenas goes back to the system: the controller's memory
      // follows what it holds, not its high mark.
      if (absl::Now() - last_trim > kTrimInterval) {
        malloc_trim(0);
        last_trim = absl::Now();
      }
    }
  });
}

void FleetMonitor::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void FleetMonitor::Sweep() {
  const std::vector<std::string> dead = registry_->SweepDead();
  if (!dead.empty()) meshes_->OnWorkersDead(dead);
  jobs_->Tick(absl::Now());
}

}  // namespace baton
