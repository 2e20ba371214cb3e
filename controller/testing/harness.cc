#include "controller/testing/harness.h"

#include <stdlib.h>

#include "absl/strings/str_cat.h"
#include "strategies/job_spec.h"

namespace baton::testing {
namespace {

std::unique_ptr<JobStore> OpenStore(const std::string& dir) {
  if (dir.empty()) return JobStore::InMemory();
  auto store = JobStore::Open(dir);
  return store.ok() ? std::move(*store) : JobStore::InMemory();
}

MeshOptions Meshes(JobStore* store) {
  MeshOptions options;
  options.rendezvous_timeout = absl::Seconds(2);
  options.rpc_slack = absl::Seconds(1);
  options.next_epoch = [store] { return store->NewEpoch(); };
  return options;
}

}  // namespace

ControllerHarness::ControllerHarness(HarnessOptions options)
    : store_(OpenStore(options.state_dir)),
      registry_(options.heartbeat_timeout, &events_),
      fleet_(options.workers, &registry_, absl::Milliseconds(50), options.devices),
      dispatcher_(fleet_.stubs()),
      meshes_(&registry_, &kv_, &events_, &dispatcher_, Meshes(store_.get())),
      jobs_(&meshes_, &events_, nullptr, store_.get(), options.jobs),
      monitor_(&registry_, &meshes_, &jobs_, absl::Milliseconds(50)) {
  meshes_.set_on_mesh_lost(
      [this](const std::string& owner, const baton::v1::Mesh& mesh, const std::string& why) { jobs_.OnMeshLost(owner, mesh, why); });
  jobs_.Recover();
  monitor_.Start();
}

ControllerHarness::~ControllerHarness() {
  monitor_.Stop();
  jobs_.Shutdown();
}

std::vector<baton::v1::Event> ControllerHarness::EventsOf(baton::v1::Event::Kind kind) {
  std::vector<baton::v1::Event> out;
  for (auto& e : events_.After(0)) {
    if (e.kind() == kind) out.push_back(std::move(e));
  }
  return out;
}

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-XXXXXX");
  return mkdtemp(dir.data()) ? dir : "";
}

HarnessOptions CheckpointingHarnessOptions() {
  HarnessOptions options;
  options.jobs.checkpoints.file_root = TempDir("root");
  return options;
}

void SlowSteps(ControllerHarness& h, absl::Duration delay) {
  FakeScript script;
  script.step_delay = delay;
  for (int i = 0; i < h.fleet().size(); ++i) h.worker(i).set_script(script);
}

std::set<std::string> WorkersOf(const baton::v1::JobStatus& s) { return {s.workers().begin(), s.workers().end()}; }

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return cond();
}

baton::v1::CreateJobRequest MlpJob(const std::string& name, int steps, const std::string& extra) {
  const std::string text = absl::StrCat("name: \"", name,
                                        "\" model { mlp { d_model: 8 blocks: 4 } } optimizer { lr: 0.01 } "
                                        "data { synthetic {} batch_size: 8 } steps: ",
                                        steps, " ", extra);
  baton::v1::CreateJobRequest req;
  auto spec = ParseJobSpec(text, false);
  if (spec.ok()) *req.mutable_job() = *spec;
  return req;
}

}  // namespace baton::testing
