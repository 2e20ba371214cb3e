// The optimizer side of a step, on the gradient pieces a ShardStore holds:
// norms, clip_grad_norm_, and AdamW on local pieces only (optimizer state
// never exists unsharded; worker/model/adamw.h is the update itself).
#ifndef BATON_WORKER_OPTIMIZER_H_
#define BATON_WORKER_OPTIMIZER_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/shard_store.h"

namespace baton {

// Sum of the squares of the gradient pieces this rank holds, in double, each
// divided by the number of ranks of the group spanning mesh axes `axes` that
// hold an identical copy, so a sum over that group counts every element once.
double SquaredGradNorm(const ShardStore& store, const std::vector<int>& axes);

// torch.nn.utils.clip_grad_norm_: the squared norms summed over `group`
// (spanning mesh axes `axes`; nullptr: this rank holds the whole gradient),
// every piece scaled by min(1, max_norm / (norm + 1e-6)). Returns the norm.
absl::StatusOr<double> ClipGradNorm(ShardStore& store, Communicator* group, const std::vector<int>& axes,
                                    double max_norm, Milliseconds timeout);

// AdamW (torch.optim.AdamW) on every master piece with its gradient piece;
// `step` is 1-based. With `keep_last_grads`, each gradient piece applied is
// kept in Param::last_grad (for tests).
void AdamWStep(ShardStore& store, const baton::v1::OptimizerSpec& spec, int64_t step, bool keep_last_grads);

}  // namespace baton

#endif  // BATON_WORKER_OPTIMIZER_H_
