#include "worker/model/batched_matmul.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "worker/model/gemm_operand.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

at::Tensor Product(const at::Tensor& a, const at::Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
  shape.back() = n;
  at::Tensor c = at::empty(shape, a.options());
  const GemmOperand oa = AsGemmOperand(a), ob = AsGemmOperand(b);
  // BLAS is column-major: it reads each row-major operand as its transpose.
  const int lda = static_cast<int>(oa.ld), ldb = static_cast<int>(ob.ld);
  const int64_t batch_dims = a.dim() - 2;
  int64_t count = 1;
  for (int64_t d = 0; d < batch_dims; ++d) count *= a.size(d);
  const float alpha = 1.0f, beta = 0.0f;
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k), ldc = static_cast<int>(n);
  const float* pa = oa.t.data_ptr<float>();
  const float* pb = ob.t.data_ptr<float>();
  float* pc = c.data_ptr<float>();
  for (int64_t i = 0; i < count; ++i) {
    int64_t off_a = 0, off_b = 0, rest = i;
    for (int64_t d = batch_dims - 1; d >= 0; --d) {
      const int64_t idx = rest % a.size(d);
      rest /= a.size(d);
      off_a += idx * oa.t.stride(d);
      off_b += idx * ob.t.stride(d);
    }
    // C^T (n x m) = B^T (n x k) A^T (k x m), column-major.
    sgemm_(&ob.trans, &oa.trans, &M, &N, &K, &alpha, pb + off_b, &ldb, pa + off_a, &lda, &beta,
           pc + i * m * n, &ldc);
  }
  return c;
}

class BatchedMatmulFunction : public torch::autograd::Function<BatchedMatmulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return Product(a, b);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = Product(g, b.transpose(-2, -1));
    if (ctx->needs_input_grad(1)) gb = Product(a.transpose(-2, -1), g);
    return {ga, gb};
  }
};

}  // namespace

at::Tensor BatchedMatmul(const at::Tensor& a, const at::Tensor& b) {
  auto fits = [](const at::Tensor& x) {  // BLAS takes int sizes and leading dimensions
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (x.size(d) > std::numeric_limits<int>::max() || x.stride(d) > std::numeric_limits<int>::max()) return false;
    }
    return x.numel() > 0 && x.device().is_cpu() && x.scalar_type() == at::kFloat;
  };
  const bool plain = fits(a) && fits(b) && a.dim() >= 3 && a.dim() == b.dim() &&
                     a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) && a.size(-1) == b.size(-2);
  if (!plain) return at::matmul(a, b);  // other dtypes and devices, broadcasting, a matrix or vector operand
  return BatchedMatmulFunction::apply(a, b);
}

}  // namespace baton
