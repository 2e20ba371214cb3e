// AdamW with torch.optim.AdamW's update (decoupled weight decay, bias
// correction), applied to whatever tensors it is given: the full parameters
// in the reference and DDP, local shards everywhere else. The update is
// elementwise, so a shard's update equals that slice of the full update.
#ifndef BATON_WORKER_MODEL_ADAMW_H_
#define BATON_WORKER_MODEL_ADAMW_H_

#include <ATen/core/Tensor.h>

#include "proto/job.pb.h"

namespace baton {

// `step` is 1-based. All tensors fp32 and of one shape; updated in place.
void AdamWUpdate(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                 at::Tensor& exp_avg_sq, int64_t step, const baton::v1::OptimizerSpec& opt);

// torch.nn.utils.clip_grad_norm_'s coefficient: min(1, max_norm / (norm + 1e-6)).
double ClipCoefficient(double total_norm, double max_norm);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_ADAMW_H_
