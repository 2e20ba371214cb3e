#include "worker/model/linear.h"

#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>

namespace baton {

std::string WarmLinear() {
  // fp32 and bf16 (mixed precision's compute dtype): LibTorch 2.11 runs
  // each through its own kernels (MKL's sgemm; oneDNN's bf16 JIT code).
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = at::ones({32, 8}, dtype), w = at::ones({8, 8}, dtype);
    (void)at::linear(x, w);        // forward: x weight^T
    (void)at::mm(x, w);            // grad_x = g weight
    (void)at::mm(x.t(), x);        // grad_weight = g^T x
    const at::Tensor q = at::ones({2, 2, 16, 8}, dtype);
    (void)at::matmul(q, q.transpose(-2, -1));  // attention's products (bf16 takes at::matmul)
  }
  return "GEMM: the model's projections through at::linear (LibTorch's MKL/oneDNN sgemm)";
}

}  // namespace baton
