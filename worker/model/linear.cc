#include "worker/model/linear.h"

#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/mm.h>

namespace baton {

std::string WarmLinear() {
  const at::Tensor x = at::ones({32, 8}), w = at::ones({8, 8});
  (void)at::linear(x, w);        // forward: x weight^T
  (void)at::mm(x, w);            // grad_x = g weight
  (void)at::mm(x.t(), x);        // grad_weight = g^T x
  return "GEMM: the model's projections through at::linear (LibTorch's MKL/oneDNN sgemm)";
}

}  // namespace baton
