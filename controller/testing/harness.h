// A whole controller in one test process - registry, rendezvous store,
// events, dispatcher, mesh and job managers, monitor, job store - over
// in-process fake workers (testing/fake_workers.h): no daemon, no port.
#ifndef BATON_CONTROLLER_TESTING_HARNESS_H_
#define BATON_CONTROLLER_TESTING_HARNESS_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/kv_store.h"
#include "controller/dispatcher.h"
#include "controller/event_log.h"
#include "controller/fleet_monitor.h"
#include "controller/job_manager.h"
#include "controller/job_store.h"
#include "controller/mesh_manager.h"
#include "controller/testing/fake_workers.h"
#include "controller/worker_registry.h"

namespace baton::testing {

struct HarnessOptions {
  int workers = 4;
  std::vector<std::string> devices;  // each fake worker's compute_device (FakeFleet)
  std::string state_dir;  // empty: nothing persists
  absl::Duration heartbeat_timeout = absl::Milliseconds(600);
  JobManagerOptions jobs;
};

class ControllerHarness {
 public:
  explicit ControllerHarness(HarnessOptions options);
  ~ControllerHarness();

  FakeFleet& fleet() { return fleet_; }
  FakeWorker& worker(int i) { return fleet_.worker(i); }
  MeshManager& meshes() { return meshes_; }
  JobManager& jobs() { return jobs_; }
  EventLog& events() { return events_; }
  Dispatcher& dispatcher() { return dispatcher_; }

  // The events of `kind` so far.
  std::vector<baton::v1::Event> EventsOf(baton::v1::Event::Kind kind);

 private:
  std::unique_ptr<JobStore> store_;
  EventLog events_;
  KeyValueStore kv_;
  WorkerRegistry registry_;
  FakeFleet fleet_;
  Dispatcher dispatcher_;
  MeshManager meshes_;
  JobManager jobs_;
  FleetMonitor monitor_;
};

// A fresh directory under TEST_TMPDIR.
std::string TempDir(const std::string& name);
// Options whose jobs checkpoint under a fresh file root.
HarnessOptions CheckpointingHarnessOptions();
// Every fake's RunStep takes `delay`.
void SlowSteps(ControllerHarness& h, absl::Duration delay);
// Whether `job` is in `state` now.
inline bool InState(const std::shared_ptr<Job>& job, baton::v1::JobState state) { return job->state() == state; }
// The workers of a job's status.
std::set<std::string> WorkersOf(const baton::v1::JobStatus& s);

// `cond` within `timeout` (polled); false if it never held.
bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(10));
// A small seed-lab MLP job: `mesh_and_plan` replaces the FSDP dp=2 default.
baton::v1::CreateJobRequest MlpJob(const std::string& name, int steps,
                                   const std::string& extra = "mesh { name: \"dp\" size: 2 } plan { mode: FSDP }");

}  // namespace baton::testing

#endif  // BATON_CONTROLLER_TESTING_HARNESS_H_
