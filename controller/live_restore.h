// Restoring a job from the state live workers keep past its mesh
// (worker/retained_state.h), worker to worker and without disk: after a
// failure the survivors' pieces (and replicas of the dead ones' along a
// data-parallel replicate axis), and for a rescale or a grow-back every
// piece. Pieces of different steps never mix: only workers that keep the
// job at the step the controller last recorded count as holders; when they
// do not hold every piece the target mesh needs, the job loads from its
// last checkpoint instead.
#ifndef BATON_CONTROLLER_LIVE_RESTORE_H_
#define BATON_CONTROLLER_LIVE_RESTORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/checkpoint_coordinator.h"
#include "controller/mesh_manager.h"
#include "strategies/dry_run.h"

namespace baton {

// What a job left on its workers when its mesh went (a failure, a rescale,
// a grow-back, a controller restart): the Programs its ranks ran, that mesh
// (its workers by rank) and the step it was at. Its restore reads it from
// them when they keep all of it; its data stream is the job's own.
struct LiveState {
  std::shared_ptr<const JobPlan> plan;
  // Its workers by rank; an address left empty is the one the worker of
  // that name has registered now (a restarted controller knows the names).
  baton::v1::Mesh mesh;
  int step = 0;
  // The last step whose figures the job's log holds: the steps after it
  // that the workers ran are recorded from the figures they kept.
  int logged_step = 0;
};

// Asks the workers of `live.mesh` what they keep of `job_id` and plans the
// load of `programs` on `mesh` from those at one step: live.step when its
// holders keep all of it, else the newest later step whose holders do
// (survivors of a failed K-step call may be a step ahead of the record);
// the plan's step says which. NOT_FOUND (nothing touched) when no step's
// holders keep all of it.
// `figures`: each holder's figures of the steps after live.logged_step up
// to the plan's step (a RunStepResponse of its rank in live.mesh).
absl::StatusOr<RestorePlan> PlanLiveRestore(MeshManager& meshes, const std::string& job_id, const LiveState& live,
                                            const baton::v1::Mesh& mesh,
                                            const std::vector<baton::v1::Program>& programs,
                                            std::vector<CallResult<baton::v1::RunStepResponse>>* figures);

// Tells the workers of `mesh` to drop what they keep of `job_id` (best
// effort, bounded).
void ReleaseLiveState(MeshManager& meshes, const std::string& job_id, const baton::v1::Mesh& mesh);

}  // namespace baton

#endif  // BATON_CONTROLLER_LIVE_RESTORE_H_
