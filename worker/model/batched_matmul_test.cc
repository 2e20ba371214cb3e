// BatchedMatmul against at::matmul, both held to the same products in
// float64: BatchedMatmul runs one BLAS sgemm per matrix, at::matmul whatever
// LibTorch's build picks (MKL, oneDNN), so their bits agree only where the
// two libraries happen to share a kernel; which ones do depends on the CPU.
#include "worker/model/batched_matmul.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <functional>

#include "gtest/gtest.h"
#include "worker/model/kernel_check.h"

namespace baton {
namespace {

using kernel_check::Grads;
using kernel_check::kSame;
using kernel_check::RunWithGradients;
using kernel_check::View;

void ExpectSame(const char* name, const at::Tensor& a, const View& view_a, const at::Tensor& b, const View& view_b) {
  const auto matmul = [](const at::Tensor& x, const at::Tensor& y) { return at::matmul(x, y); };
  const auto batched = [](const at::Tensor& x, const at::Tensor& y) { return BatchedMatmul(x, y); };
  const at::Tensor out = at::matmul(view_a(a), view_b(b));
  const at::Tensor grad = at::arange(out.numel(), out.options()).view(out.sizes()).div(97).add(0.5);
  const Grads got = RunWithGradients(a, view_a, b, view_b, grad, batched);
  const Grads base = RunWithGradients(a, view_a, b, view_b, grad, matmul);
  const Grads want = RunWithGradients(a.to(at::kDouble), view_a, b.to(at::kDouble), view_b, grad, matmul);
  std::printf("%-34s bit for bit at::matmul's: %s\n", name, got.Equal(base) ? "yes" : "no");
  // fp32 products of inner dimension <= 8: a few ulps of the largest value.
  kernel_check::ExpectNearFloat64(name, "BatchedMatmul", got, "at::matmul", base, want, 2e-6, 1e-6);
}

TEST(BatchedMatmulTest, MatchesFloat64ForEveryLayout) {
  at::manual_seed(1);
  const int64_t b = 3, h = 2, t = 7, d = 5;
  // Attention's layouts: [b, t, h, d] memory seen as [b, h, t, d].
  const View heads = [](const at::Tensor& x) { return x.transpose(1, 2); };
  const View heads_t = [](const at::Tensor& x) { return x.transpose(1, 2).transpose(-2, -1); };
  ExpectSame("q k^T (the model's layout)", at::randn({b, t, h, d}), heads, at::randn({b, t, h, d}), heads_t);
  ExpectSame("probs v", at::randn({b, h, t, t}), kSame, at::randn({b, t, h, d}), heads);
  ExpectSame("contiguous 3-D", at::randn({4, 6, 3}), kSame, at::randn({4, 3, 5}), kSame);
  const View t12 = [](const at::Tensor& x) { return x.transpose(1, 2); };
  ExpectSame("both transposed", at::randn({4, 3, 6}), t12, at::randn({4, 5, 3}), t12);
  const View slice = [](const at::Tensor& x) { return x.narrow(2, 1, 3); };
  ExpectSame("a strided slice", at::randn({4, 6, 8}), slice, at::randn({4, 3, 5}), kSame);
  ExpectSame("one row", at::randn({4, 1, 3}), kSame, at::randn({4, 3, 5}), kSame);
  const View expand = [](const at::Tensor& x) { return x.expand({4, 6, 3}); };
  ExpectSame("an expanded batch (stride 0)", at::randn({1, 6, 3}), expand, at::randn({4, 3, 5}), kSame);
}

TEST(BatchedMatmulTest, OtherCasesFallBackToMatmul) {
  at::manual_seed(2);
  ExpectSame("broadcast batch", at::randn({4, 6, 3}), kSame, at::randn({1, 3, 5}), kSame);
  // bf16 takes at::matmul itself: the same call, the same bits.
  const at::Tensor x = at::randn({2, 3, 4}).to(at::kBFloat16), y = at::randn({2, 4, 5}).to(at::kBFloat16);
  EXPECT_TRUE(BatchedMatmul(x, y).equal(at::matmul(x, y))) << "bf16 takes at::matmul";
  EXPECT_EQ(BatchedMatmul(at::randn({2, 3, 4}), at::randn({4, 5})).sizes(), at::IntArrayRef({2, 3, 5}));
}

}  // namespace
}  // namespace baton
