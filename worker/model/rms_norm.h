// RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight over the last dimension,
// as one pass per row forward and two backward (differentiable).
//
// Written with LibTorch's operators it is six kernels forward (pow, mean, add,
// rsqrt, two products) and more backward, each a pass over memory and a new
// tensor: for the decoder of bench/vs_pytorch.sh (512 tokens of dim 128) a
// norm's forward and backward took 0.37-0.49 ms, here 0.09-0.12
// (`bazel run -c opt //bench:kernels`), over nine norms a step.
// Forward sums each row's squares in fp32 lanes (added pairwise), then goes
// on as the operators do (/ dim, + eps, 1 / sqrt, x * r, then * weight);
// backward computes the exact gradients,
//   dx = r (g weight) - x r^3 mean(g weight x),   dweight = sum over rows of g r x,
// the weight's over blocks of rows added in float64. The results are within
// fp32 rounding of the operators' (rms_norm_test holds both to float64), the
// same bits whatever the thread count or instruction set.
//
// Other dtypes and devices: the operators above, as before.
#ifndef BATON_WORKER_MODEL_RMS_NORM_H_
#define BATON_WORKER_MODEL_RMS_NORM_H_

#include <ATen/core/Tensor.h>

namespace baton {

// x: [..., dim]; weight: [dim].
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The same with LibTorch's operators (the fallback, and what tests and the
// bench compare with).
at::Tensor RmsNormByOperators(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_RMS_NORM_H_
