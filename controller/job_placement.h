// JobPlacement: what a job is placed with. Immutable, and swapped whole (a
// Job holds the one in force), so a reader never sees a spec beside another
// mesh's Programs:
//   - its own mesh's spec and Programs: as submitted, or as last rescaled;
//   - the spec and Programs it is placed with now: those, or - shrunk onto
//     the workers left after a failure (RestartPolicy.min_workers) - the
//     same with a smaller data-parallel axis.
// The workers it is placed on (the mesh formed) are its status's.
#ifndef BATON_CONTROLLER_JOB_PLACEMENT_H_
#define BATON_CONTROLLER_JOB_PLACEMENT_H_

#include <memory>

#include "proto/job.pb.h"
#include "strategies/dry_run.h"

namespace baton {

struct JobPlacement {
  std::shared_ptr<const baton::v1::JobSpec> own;
  std::shared_ptr<const JobPlan> own_plan;
  std::shared_ptr<const baton::v1::JobSpec> spec;  // placed with
  std::shared_ptr<const JobPlan> plan;             // spec's Programs

  bool shrunk() const { return spec != own; }
  int workers() const {
    int n = 1;
    for (const auto& axis : spec->mesh()) n *= axis.size();
    return n;
  }

  // On its own mesh `own`, with its Programs.
  static std::shared_ptr<const JobPlacement> Own(baton::v1::JobSpec own, std::shared_ptr<const JobPlan> plan) {
    auto p = std::make_shared<JobPlacement>();
    p->own = std::make_shared<const baton::v1::JobSpec>(std::move(own));
    p->own_plan = std::move(plan);
    p->spec = p->own;
    p->plan = p->own_plan;
    return p;
  }
  // The same job shrunk: placed with `placed` and its Programs.
  std::shared_ptr<const JobPlacement> Shrunk(baton::v1::JobSpec placed, std::shared_ptr<const JobPlan> placed_plan) const {
    auto p = std::make_shared<JobPlacement>(*this);
    p->spec = std::make_shared<const baton::v1::JobSpec>(std::move(placed));
    p->plan = std::move(placed_plan);
    return p;
  }
  // Back on its own mesh.
  std::shared_ptr<const JobPlacement> Unshrunk() const {
    auto p = std::make_shared<JobPlacement>(*this);
    p->spec = own;
    p->plan = own_plan;
    return p;
  }
  // What an ended job keeps: what its Programs predicted, not the Programs.
  std::shared_ptr<const JobPlacement> WithoutPrograms() const {
    auto p = std::make_shared<JobPlacement>(*this);
    auto strip = [](const std::shared_ptr<const JobPlan>& plan) -> std::shared_ptr<const JobPlan> {
      if (plan == nullptr || plan->programs.empty()) return plan;
      auto kept = std::make_shared<JobPlan>();
      kept->theory = plan->theory;
      kept->theory.ranks.clear();
      kept->max_idle_fraction = plan->max_idle_fraction;
      return kept;
    };
    p->plan = strip(plan);
    p->own_plan = shrunk() ? strip(own_plan) : p->plan;
    return p;
  }
};

}  // namespace baton

#endif  // BATON_CONTROLLER_JOB_PLACEMENT_H_
