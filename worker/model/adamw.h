// AdamW with torch.optim.AdamW's update (decoupled weight decay, bias
// correction), applied to whatever tensors it is given: the full parameters
// in the reference and DDP, local shards everywhere else. The update is
// elementwise, so a shard's update equals that slice of the full update.
#ifndef BATON_WORKER_MODEL_ADAMW_H_
#define BATON_WORKER_MODEL_ADAMW_H_

#include <ATen/core/Tensor.h>

#include "proto/job.pb.h"

namespace baton {

// `step` is 1-based. All tensors of one shape; updated in place. Contiguous
// fp32 tensors in host memory (every parameter, shard and state a worker
// keeps on CPU) are updated in one pass, each element with the same float
// operations as the tensor ops below, rounded once each, over the rank's
// intra-op threads (the bits do not depend on their number): within an ulp or
// two of PyTorch's kernels (which fuse some multiply-adds), and a shard's
// update is bit for bit its slice of the full update. Anything else goes
// through AdamWUpdateTensorOps.
void AdamWUpdate(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                 at::Tensor& exp_avg_sq, int64_t step, const baton::v1::OptimizerSpec& opt);

// The same update as torch.optim.AdamW's single-tensor algorithm writes it,
// in seven tensor ops (device tensors, strided views; and the baseline
// bench/adamw measures the one-pass update against), with the one change the
// one pass makes: the bias correction's square root is applied as a product
// with its reciprocal.
void AdamWUpdateTensorOps(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, int64_t step, const baton::v1::OptimizerSpec& opt);

// The sum of a gradient's squared elements, in double precision (the
// gradient norm's part: clipping and the reported norm). Contiguous fp32
// host tensors in one pass over 16 double accumulators, combined in a fixed
// order: the same bits on every machine and vector width; anything else
// through tensor ops.
double SumOfSquares(const at::Tensor& grad);

// torch.nn.utils.clip_grad_norm_'s coefficient: min(1, max_norm / (norm + 1e-6)).
double ClipCoefficient(double total_norm, double max_norm);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_ADAMW_H_
