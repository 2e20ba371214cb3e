#include "controller/live_restore.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "strategies/checkpoint_plan.h"

namespace baton {
namespace {

// How long a survivor may take to say what it keeps (its last step on the
// aborted mesh returning first), and to drop it.
constexpr absl::Duration kAskWait = absl::Seconds(5);
constexpr absl::Duration kAskSlack = absl::Seconds(5);

// The workers of `mesh` still alive at the address they had in it (a dead
// one's replacement keeps nothing of the job), and their ranks.
// A worker named without an address (a mesh a restarted controller knows
// from its job table) is asked at the address it registered.
std::vector<WorkerTarget> AliveWorkers(MeshManager& meshes, const baton::v1::Mesh& mesh, std::vector<size_t>* ranks) {
  std::set<std::pair<std::string, std::string>> alive;
  std::map<std::string, std::string> address;
  for (const auto& w : meshes.Workers()) {
    if (w.state() == baton::v1::DEAD) continue;
    alive.insert({w.name(), w.address()});
    address[w.name()] = w.address();
  }
  std::vector<WorkerTarget> all;
  for (int r = 0; r < mesh.worker_names_size(); ++r) {
    const std::string& name = mesh.worker_names(r);
    const std::string at = r < mesh.worker_addresses_size() && !mesh.worker_addresses(r).empty()
                               ? mesh.worker_addresses(r)
                               : (address.count(name) ? address[name] : "");
    all.push_back({name, at});
  }
  std::vector<WorkerTarget> out;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!alive.count({all[r].name, all[r].address})) continue;
    out.push_back(all[r]);
    if (ranks != nullptr) ranks->push_back(r);
  }
  return out;
}

}  // namespace

absl::StatusOr<RestorePlan> PlanLiveRestore(MeshManager& meshes, const std::string& job_id, const LiveState& live,
                                            const baton::v1::Mesh& mesh,
                                            const std::vector<baton::v1::Program>& programs,
                                            std::vector<CallResult<baton::v1::RunStepResponse>>* figures) {
  if (live.plan == nullptr || live.plan->programs.empty() || live.step < 0) {
    return absl::NotFoundError("nothing of it is kept live");
  }
  std::vector<size_t> ranks;  // in live.mesh
  const std::vector<WorkerTarget> asked = AliveWorkers(meshes, live.mesh, &ranks);
  FanOut fan_out;
  fan_out.deadline = kAskWait + kAskSlack;
  auto answers = meshes.dispatcher()->Call<GetRetainedRpc>(
      asked,
      [&](size_t) {
        baton::v1::GetRetainedRequest req;
        req.set_job_id(job_id);
        req.set_wait_ms(absl::ToInt64Milliseconds(kAskWait));
        req.set_figures_after(live.logged_step);
        return req;
      },
      fan_out);
  // Holders by the step they keep. A failed K-step call can leave survivors
  // a step past the one the controller recorded (a rank completes a step
  // all-or-none, ranks need not stop at the same one): every holder at one
  // step keeps the same global state, so any step whose holders together
  // keep every piece will do - the recorded one first (no step's metrics
  // lost), else the newest.
  std::map<int, std::vector<LiveHolder>, std::greater<int>> by_step;
  std::map<int, std::vector<CallResult<baton::v1::RunStepResponse>>> figures_at;  // by step
  for (size_t i = 0; i < answers.size(); ++i) {
    const auto& a = answers[i];
    // A state at step 0 is the job's start: nothing worth moving.
    if (!a.status.ok() || !a.response.held() || a.response.step() < std::max(1, live.step)) continue;
    LiveHolder h;
    h.rank = static_cast<int>(ranks[i]);
    h.source.set_worker(asked[i].name);
    h.source.set_address(asked[i].address);
    h.source.set_job_id(job_id);
    h.source.set_step(a.response.step());
    by_step[a.response.step()].push_back(std::move(h));
    CallResult<baton::v1::RunStepResponse> f;
    f.response.set_rank(static_cast<int>(ranks[i]));
    *f.response.mutable_metrics() = a.response.figures();
    figures_at[a.response.step()].push_back(std::move(f));
  }
  if (by_step.empty()) {
    return absl::NotFoundError(absl::StrCat("no worker of ", live.mesh.mesh_id(), " keeps it at step ", live.step,
                                            " or later"));
  }
  std::vector<int> steps;
  if (by_step.count(live.step)) steps.push_back(live.step);
  for (const auto& [step, holders] : by_step) {
    if (step != live.step) steps.push_back(step);
  }
  std::vector<std::string> targets(mesh.worker_names().begin(), mesh.worker_names().end());
  absl::Status first;
  for (int step : steps) {
    auto reads = PlanPeerLoad(live.plan->programs, by_step[step], programs, targets);
    if (!reads.ok()) {
      if (first.ok()) first = absl::Status(reads.status().code(), absl::StrCat("at step ", step, ": ", reads.status().message()));
      continue;
    }
    RestorePlan plan;
    plan.optimizer = true;
    plan.metadata.set_step(step);
    plan.info.set_step(step);
    plan.info.set_from_peers(true);
    plan.reads = std::move(*reads);
    if (figures != nullptr) *figures = std::move(figures_at[step]);
    return plan;
  }
  return first;
}

void ReleaseLiveState(MeshManager& meshes, const std::string& job_id, const baton::v1::Mesh& mesh) {
  FanOut fan_out;
  fan_out.deadline = kAskSlack;
  meshes.dispatcher()->Call<ReleaseStateRpc>(
      AliveWorkers(meshes, mesh, nullptr),
      [&](size_t) {
        baton::v1::ReleaseStateRequest req;
        req.set_job_id(job_id);
        return req;
      },
      fan_out);
}

}  // namespace baton
