#include "worker/model/linear.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/linear.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/blas_kernels.h"
#include "worker/model/gemm_operand.h"

// oneDNN's C API (dnnl.h, oneDNN 2.x and 3.x): row-major C = alpha op(A) op(B) + beta C.
extern "C" int dnnl_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// a [m, k] @ b [k, n], fp32, into a new contiguous [m, n].
at::Tensor Product(const at::Tensor& a, const at::Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  at::Tensor c = at::empty({m, n}, a.options());
  const GemmOperand oa = AsGemmOperand(a), ob = AsGemmOperand(b);
  const int status = dnnl_sgemm(oa.trans, ob.trans, m, n, k, 1.0f, oa.t.data_ptr<float>(), oa.ld,
                                ob.t.data_ptr<float>(), ob.ld, 0.0f, c.data_ptr<float>(), n);
  TORCH_CHECK(status == 0, "oneDNN sgemm failed (status ", status, ") for ", m, " x ", k, " @ ", k, " x ", n);
  return c;
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    ctx->save_for_backward({rows, weight});
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return Product(rows, weight.t()).view(shape);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor g = grads[0].reshape({-1, weight.size(0)});
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      std::vector<int64_t> shape(grads[0].sizes().begin(), grads[0].sizes().end());
      shape.back() = weight.size(1);
      gx = Product(g, weight).view(shape);
    }
    if (ctx->needs_input_grad(1)) gw = Product(g.t(), rows);
    return {gx, gw};
  }
};

bool ChooseOneDnn() {
  const char* gemm = std::getenv("BATON_GEMM");
  if (gemm != nullptr && std::strcmp(gemm, "blas") == 0) return false;
  return VectorLevelOfCpu() >= VectorLevel::kAvx2;
}

}  // namespace

bool LinearUsesOneDnn() {
  static const bool use = ChooseOneDnn();
  return use;
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool plain = LinearUsesOneDnn() && !bias.defined() && x.dim() >= 1 && weight.dim() == 2 &&
                     x.size(-1) == weight.size(1) && x.scalar_type() == at::kFloat &&
                     weight.scalar_type() == at::kFloat && x.device().is_cpu() && weight.device().is_cpu() &&
                     weight.numel() > 0 && x.numel() / std::max<int64_t>(x.size(-1), 1) >= kMinRows;
  if (!plain) return at::linear(x, weight, bias);
  return LinearFunction::apply(x, weight);
}

std::string WarmLinear() {
  if (!LinearUsesOneDnn()) return "GEMM: the model's projections through at::linear (LibTorch's BLAS)";
  const at::Tensor x = at::ones({kMinRows, 8}), w = at::ones({8, 8});
  (void)Product(x, w.t());            // forward: x weight^T
  (void)Product(x, w);                // grad_x = g weight
  (void)Product(x.t(), x);            // grad_weight = g^T x
  return "GEMM: the model's projections through oneDNN's sgemm (worker/model/linear.h)";
}

}  // namespace baton
