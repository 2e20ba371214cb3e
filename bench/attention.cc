// The attention core's two products (scores = q k^T, out = probs v), forward
// and backward, with at::matmul against BatchedMatmul (worker/model/
// batched_matmul.h: one sgemm per matrix), alternating iteration by iteration
// in one process so that the machine's drift falls on both alike. Prints the
// median of each, their ratio, and whether outputs and gradients agree bit
// for bit.
//
//   bazel run -c opt //bench:attention [BATCH HEADS SEQ HEAD_DIM ITERATIONS]
//   (defaults 8 4 64 32 400: bench/vs_pytorch.sh's decoder)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "bench/proc_stats.h"
#include "common/blas_kernels.h"
#include "worker/model/batched_matmul.h"

namespace {

struct Result {
  at::Tensor out, dq, dk, dv;
};

template <typename Product>
Result Core(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& mask,
            const at::Tensor& grad, Product product) {
  at::Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
  // As the model lays them out: [b, t, h, d] memory viewed as [b, h, t, d].
  const at::Tensor qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);
  at::Tensor scores = product(qh, kh.transpose(-2, -1)).mul(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  at::Tensor probs = at::softmax(scores.add(mask), -1);
  at::Tensor out = product(probs, vh);
  out.backward(grad);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

}  // namespace

int main(int argc, char** argv) {
  baton::ExecWithFullBlasKernels(argv);  // the kernels the workers run
  const int64_t b = argc > 1 ? std::atoll(argv[1]) : 8, h = argc > 2 ? std::atoll(argv[2]) : 4;
  const int64_t t = argc > 3 ? std::atoll(argv[3]) : 64, d = argc > 4 ? std::atoll(argv[4]) : 32;
  const int iterations = argc > 5 ? std::atoi(argv[5]) : 400;
  at::set_num_threads(1);
  at::manual_seed(0);
  const at::Tensor q = at::randn({b, t, h, d}), k = at::randn({b, t, h, d}), v = at::randn({b, t, h, d});
  const at::Tensor mask = at::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
  const at::Tensor grad = at::randn({b, h, t, d});
  auto torch_product = [](const at::Tensor& x, const at::Tensor& y) { return at::matmul(x, y); };
  auto batched = [](const at::Tensor& x, const at::Tensor& y) { return baton::BatchedMatmul(x, y); };
  const Result a = Core(q, k, v, mask, grad, torch_product), c = Core(q, k, v, mask, grad, batched);
  const bool same = a.out.equal(c.out) && a.dq.equal(c.dq) && a.dk.equal(c.dk) && a.dv.equal(c.dv);
  const auto [mt, mb] = baton::bench::AlternatingMedians(
      iterations, 20, [&] { Core(q, k, v, mask, grad, torch_product); }, [&] { Core(q, k, v, mask, grad, batched); });
  std::printf("attention core [%lld, %lld, %lld, %lld], forward + backward, median of %d alternating iterations:\n",
              static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(t),
              static_cast<long long>(d), iterations);
  std::printf("  at::matmul     %.3f ms\n  BatchedMatmul  %.3f ms\n  BatchedMatmul / at::matmul = %.3f\n", mt, mb,
              mb / mt);
  std::printf("  outputs and gradients bit for bit the same: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}
