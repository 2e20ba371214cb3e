// Linear (oneDNN's sgemm) against the same product in float64, which shares
// no code with either BLAS, and against at::linear; outputs and both
// gradients, for the layouts the model hands it; and the cases that stay with
// at::linear.
#include "worker/model/linear.h"

#include <ATen/ATen.h>

#include <cstdio>

#include "common/blas_kernels.h"
#include "gtest/gtest.h"
#include "worker/model/kernel_check.h"

namespace baton {
namespace {

using kernel_check::Grads;
using kernel_check::kSame;
using kernel_check::RunWithGradients;
using kernel_check::View;

void ExpectClose(const char* name, const at::Tensor& x, const View& view_x, const at::Tensor& w, const View& view_w) {
  const at::Tensor grad = at::randn(at::linear(view_x(x), view_w(w)).sizes());
  const auto linear = [](const at::Tensor& a, const at::Tensor& b) { return Linear(a, b); };
  const auto torch_linear = [](const at::Tensor& a, const at::Tensor& b) { return at::linear(a, b); };
  const Grads got = RunWithGradients(x, view_x, w, view_w, grad, linear);
  const Grads blas = RunWithGradients(x, view_x, w, view_w, grad, torch_linear);
  const Grads want = RunWithGradients(x.to(at::kDouble), view_x, w.to(at::kDouble), view_w, grad, torch_linear);
  std::printf("%-34s bit for bit at::linear's: %s\n", name, got.Equal(blas) ? "yes" : "no");
  // fp32 with K up to 1024: within 2e-6 of the largest value (a few ulps of
  // the partial sums), and no worse than 4x what OpenBLAS gives.
  kernel_check::ExpectNearFloat64(name, "Linear", got, "at::linear", blas, want, 2e-6, 1e-7);
}

TEST(LinearTest, MatchesFloat64ForTheModelsLayouts) {
  std::printf("Linear runs oneDNN's sgemm here: %s\n", LinearUsesOneDnn() ? "yes" : "no (at::linear)");
  if (VectorLevelOfCpu() >= VectorLevel::kAvx2 && std::getenv("BATON_GEMM") == nullptr) {
    EXPECT_TRUE(LinearUsesOneDnn()) << "an AVX2 CPU should take oneDNN's sgemm";
  }
  at::manual_seed(3);
  ExpectClose("3-D tokens, square weight", at::randn({4, 16, 32}), kSame, at::randn({32, 32}), kSame);
  ExpectClose("wider out (an MLP's w1)", at::randn({2, 40, 24}), kSame, at::randn({96, 24}), kSame);
  ExpectClose("long K (1024)", at::randn({64, 1024}), kSame, at::randn({48, 1024}), kSame);
  // Attention's output as the model leaves it: [b, h, t, d] seen as [b, t, h * d] after a transpose.
  const View heads_out = [](const at::Tensor& o) { return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1}); };
  ExpectClose("attention out (a copy by reshape)", at::randn({2, 4, 20, 8}), heads_out, at::randn({32, 32}), kSame);
  const View columns = [](const at::Tensor& x) { return x.narrow(-1, 8, 24); };
  ExpectClose("a column slice (row stride 40)", at::randn({3, 20, 40}), columns, at::randn({16, 24}), kSame);
  const View transposed = [](const at::Tensor& w) { return w.t(); };
  ExpectClose("a transposed weight", at::randn({50, 12}), kSame, at::randn({12, 20}), transposed);
}

TEST(LinearTest, OtherCasesTakeAtLinear) {
  at::manual_seed(4);
  const at::Tensor few = at::randn({kMinRows - 1, 16}), w = at::randn({8, 16});
  EXPECT_TRUE(Linear(few, w).equal(at::linear(few, w))) << "fewer rows than kMinRows";
  const at::Tensor x = at::randn({64, 16}), bias = at::randn({8});
  EXPECT_TRUE(Linear(x, w, bias).equal(at::linear(x, w, bias))) << "a bias";
  const at::Tensor xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
  EXPECT_TRUE(Linear(xb, wb).equal(at::linear(xb, wb))) << "bf16";
  EXPECT_EQ(Linear(at::randn({2, 3, 64, 16}), w).sizes(), at::IntArrayRef({2, 3, 64, 8}));
}

}  // namespace
}  // namespace baton
