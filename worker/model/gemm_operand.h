// How a GEMM reads a matrix view (the last two dimensions of a tensor)
// without a copy: the worker's two GEMM paths (Linear's row-major oneDNN
// sgemm, BatchedMatmul's column-major BLAS sgemm) both take a matrix whose
// rows are contiguous as it is ('N') and one whose columns are as the
// transpose of a contiguous one ('T'); a layout of neither is copied.
#ifndef BATON_WORKER_MODEL_GEMM_OPERAND_H_
#define BATON_WORKER_MODEL_GEMM_OPERAND_H_

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>

namespace baton {

struct GemmOperand {
  at::Tensor t;  // x itself, or its contiguous copy
  char trans;    // 'N': rows contiguous with stride ld; 'T': columns contiguous with stride ld
  int64_t ld;
};

inline GemmOperand AsGemmOperand(const at::Tensor& x) {
  const int64_t rows = x.size(-2), cols = x.size(-1);
  if (x.stride(-1) == 1 && x.stride(-2) >= std::max<int64_t>(cols, 1)) return {x, 'N', x.stride(-2)};
  if (x.stride(-2) == 1 && x.stride(-1) >= std::max<int64_t>(rows, 1)) return {x, 'T', x.stride(-1)};
  return {x.contiguous(), 'N', std::max<int64_t>(cols, 1)};
}

}  // namespace baton

#endif  // BATON_WORKER_MODEL_GEMM_OPERAND_H_
