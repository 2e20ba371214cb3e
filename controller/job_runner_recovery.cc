// JobRunner's restore from live workers: what a mesh that went (a failure,
// a rescale, a grow-back, a controller restart) left on its workers
// (LiveState), read worker to worker (controller/live_restore.h) - a
// checkpoint being the fallback - and the figures of the steps a cut-off
// call ran that the controller never recorded.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/job_runner.h"
#include "controller/live_restore.h"
#include "controller/step_metrics.h"
#include "program/wire.h"
#include "mesh/device_mesh.h"
#include "strategies/job_spec.h"

namespace baton {

LiveState JobRunner::LiveLeft() const {
  LiveState live;
  live.plan = job_->plan();
  live.mesh = mesh_;
  live.step = job_->step();
  live.logged_step = live.step;
  return live;
}

absl::StatusOr<std::optional<baton::v1::CheckpointInfo>> JobRunner::RestoreLive(const std::optional<LiveState>& live,
                                                                                const baton::v1::Mesh& mesh,
                                                                                std::string* why_not) {
  if (!live.has_value()) return std::nullopt;
  // Not behind the checkpoint it would load otherwise (one published after
  // the record a restarted controller read was written is newer than that
  // record's step, but the workers may be as far).
  const int disk_step = restore_.info.path().empty() || !restore_.optimizer ? 0 : restore_.metadata.step();
  LiveState wanted = *live;
  wanted.step = std::max(live->step, disk_step);
  std::vector<CallResult<baton::v1::RunStepResponse>> figures;
  auto plan = PlanLiveRestore(*context_.meshes, job_->id(), wanted, mesh, job_->plan()->programs, &figures);
  if (!plan.ok()) {
    // Said by the restore from disk that follows (JOB_RESTORED).
    *why_not = std::string(plan.status().message());
    return std::nullopt;
  }
  auto loaded = checkpoints_.Load(*plan, mesh);
  if (!loaded.ok()) {
    // Its ranks are half-loaded: placed again, it loads from disk.
    return absl::UnavailableError(absl::StrCat("restoring from live workers failed: ", loaded.status().message()));
  }
  loaded->set_steps_redone(std::max(0, live->logged_step - loaded->step()));
  loaded->set_steps_recovered(RecordKeptFigures(figures, live->logged_step, loaded->step()));
  return *loaded;
}

int JobRunner::RecordKeptFigures(const std::vector<CallResult<baton::v1::RunStepResponse>>& figures, int logged,
                                 int step) {
  // The steps a cut-off call ran that the controller never recorded: from
  // the ranks that kept every one of them (a dead rank's figures are stood
  // for by the others', as for a failed call's completed steps). The
  // controller did not time them: their step_ms is 0.
  const int n = step - logged;
  if (n <= 0) return 0;
  std::vector<CallResult<baton::v1::RunStepResponse>> complete;
  for (const auto& f : figures) {
    const auto& m = f.response.metrics();
    if (m.size() == n && m[0].step() == logged + 1 && m[n - 1].step() == step) complete.push_back(f);
  }
  if (complete.empty()) return 0;
  for (int i = 0; i < n; ++i) {
    int64_t comm_bytes = 0;  // all ranks together
    for (const auto& r : complete) comm_bytes += r.response.metrics(i).comm_bytes();
    job_->RecordStep(AggregateStep(complete, i, 0), comm_bytes);
  }
  return n;
}

}  // namespace baton
