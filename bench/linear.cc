// A decoder block's projections (wq, wk, wv, wo, w1, w2) and the output
// head, forward and backward, with at::linear (LibTorch's BLAS) against
// Linear (worker/model/linear.h: oneDNN's sgemm), alternating iteration by
// iteration in one process so that the machine's drift falls on both alike.
// Both BLAS run the kernels the workers run (ExecWithFullBlasKernels).
// Prints the median of each, their ratio, and how far apart their results
// are.
//
//   bazel run -c opt //bench:linear [TOKENS DIM FFN_DIM VOCAB ITERATIONS]
//   (defaults 512 128 512 256 300: bench/vs_pytorch.sh's decoder, 8 x 64 tokens)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/proc_stats.h"
#include "common/blas_kernels.h"
#include "worker/model/linear.h"

namespace {

struct Result {
  at::Tensor out;
  std::vector<at::Tensor> grads;  // x's, then each weight's
};

// The block's projections in the model's order, each fed the previous output
// (or the block input), summed into one loss-like scalar's backward.
template <typename Project>
Result Block(const at::Tensor& x0, const std::vector<at::Tensor>& weights0, Project project) {
  at::Tensor x = x0.detach().requires_grad_();
  std::vector<at::Tensor> w;
  for (const at::Tensor& t : weights0) w.push_back(t.detach().requires_grad_());
  const at::Tensor q = project(x, w[0]), k = project(x, w[1]), v = project(x, w[2]);
  const at::Tensor attn = project(q.add(k).add(v), w[3]);
  const at::Tensor hidden = project(attn, w[4]);
  const at::Tensor out = project(project(hidden, w[5]), w[6]);
  out.backward(at::ones_like(out));
  Result r{out.detach(), {x.grad()}};
  for (const at::Tensor& t : w) r.grads.push_back(t.grad());
  return r;
}

double RelativeDifference(const at::Tensor& a, const at::Tensor& b) {
  return a.sub(b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  baton::ExecWithFullBlasKernels(argv);
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 512, dim = argc > 2 ? std::atoll(argv[2]) : 128;
  const int64_t ffn = argc > 3 ? std::atoll(argv[3]) : 512, vocab = argc > 4 ? std::atoll(argv[4]) : 256;
  const int iterations = argc > 5 ? std::atoi(argv[5]) : 300;
  at::set_num_threads(1);
  at::manual_seed(0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const at::Tensor x = at::randn({tokens, dim});
  std::vector<at::Tensor> weights;
  for (int i = 0; i < 4; ++i) weights.push_back(at::randn({dim, dim}).mul(scale));
  weights.push_back(at::randn({ffn, dim}).mul(scale));
  weights.push_back(at::randn({dim, ffn}).mul(1.0 / std::sqrt(static_cast<double>(ffn))));
  weights.push_back(at::randn({vocab, dim}).mul(scale));
  auto torch_linear = [](const at::Tensor& a, const at::Tensor& w) { return at::linear(a, w); };
  auto linear = [](const at::Tensor& a, const at::Tensor& w) { return baton::Linear(a, w); };
  const Result want = Block(x, weights, torch_linear), got = Block(x, weights, linear);
  double diff = RelativeDifference(got.out, want.out);
  for (size_t i = 0; i < want.grads.size(); ++i) {
    diff = std::max(diff, RelativeDifference(got.grads[i], want.grads[i]));
  }
  const auto [mt, ml] = baton::bench::AlternatingMedians(
      iterations, 20, [&] { Block(x, weights, torch_linear); }, [&] { Block(x, weights, linear); });
  std::printf("%s\n", baton::BlasKernelsLine().c_str());
  std::printf("a block's projections and the head, %lld tokens, dim %lld, ffn %lld, vocab %lld, forward + backward,"
              " median of %d alternating iterations:\n",
              static_cast<long long>(tokens), static_cast<long long>(dim), static_cast<long long>(ffn),
              static_cast<long long>(vocab), iterations);
  std::printf("  at::linear  %.3f ms\n  Linear      %.3f ms (%s)\n  Linear / at::linear = %.3f\n", mt, ml,
              baton::LinearUsesOneDnn() ? "oneDNN sgemm" : "at::linear: BATON_GEMM=blas or a CPU below AVX2",
              ml / mt);
  std::printf("  largest difference in output and gradients, relative to each one's largest value: %.1e\n", diff);
  return diff < 1e-5 ? 0 : 1;
}
