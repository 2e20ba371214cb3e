// x @ weight^T, the model's projections, in fp32 through oneDNN's sgemm.
//
// LibTorch 1.13's CPU mm calls the BLAS it was built with (Debian's: OpenBLAS).
// For a decoder's projection shapes (hundreds to a few thousand token rows,
// K and N of 128 to 1024) oneDNN's JIT sgemm, which LibTorch already loads
// for its own oneDNN kernels, ran the same products in 0.5-0.9 of OpenBLAS's
// time (bench/linear prints it for the decoder of bench/vs_pytorch.sh).
// Differentiable: its backward is two more products, grad_x = g weight and
// grad_weight = g^T x, what at::linear's autograd computes.
//
// With a bias, other dtypes and devices, fewer than kMinRows rows (OpenBLAS is ahead on
// those), sizes past int64 leading dimensions' reach, or BATON_GEMM=blas in
// the environment (for side-by-side measurements): at::linear.
#ifndef BATON_WORKER_MODEL_LINEAR_H_
#define BATON_WORKER_MODEL_LINEAR_H_

#include <ATen/core/Tensor.h>

#include <string>

namespace baton {

// Rows of x (its elements over its last dimension) below which the product
// stays with at::linear.
inline constexpr int64_t kMinRows = 32;

// x: [..., in]; weight: [out, in]; bias (optional): [out]; returns [..., out].
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// Whether Linear runs oneDNN's sgemm in this process (it has oneDNN, the CPU
// has AVX2 or wider, BATON_GEMM is not "blas"), for logs and benchmarks.
bool LinearUsesOneDnn();

// A daemon calls this at start-up, after its allocators are set: one small
// product of each layout Linear runs (forward and both gradients), so that
// oneDNN's sgemm code is resident before the first job. Its first use maps
// ~7 MiB of the library, which the first job's memory would otherwise show.
// Returns a line for the log: which GEMM Linear runs.
std::string WarmLinear();

}  // namespace baton

#endif  // BATON_WORKER_MODEL_LINEAR_H_
