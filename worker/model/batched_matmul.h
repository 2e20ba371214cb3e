// a @ b over equal leading (batch) dimensions, in fp32: one sgemm per matrix
// on the operands' own strides (a transposed view is a BLAS flag, not a copy).
// LibTorch 1.13's CPU bmm, for attention's small per-head matrices, selects
// each matrix and runs addmm's checks (copying an operand whose layout it
// does not take) per batch entry; this runs the same sgemm without them.
// Differentiable (its backward is two more of it). Other dtypes: at::matmul.
#ifndef BATON_WORKER_MODEL_BATCHED_MATMUL_H_
#define BATON_WORKER_MODEL_BATCHED_MATMUL_H_

#include <ATen/core/Tensor.h>

namespace baton {

at::Tensor BatchedMatmul(const at::Tensor& a, const at::Tensor& b);

}  // namespace baton

#endif  // BATON_WORKER_MODEL_BATCHED_MATMUL_H_
