// Linear (oneDNN's sgemm) against the same product in float64, which shares
// no code with either BLAS, and against at::linear; outputs and both
// gradients, for the layouts the model hands it; and the cases that stay with
// at::linear.
#include "worker/model/linear.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <functional>

#include "common/blas_kernels.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

struct Grads {
  at::Tensor out, dx, dw;
};

using View = std::function<at::Tensor(const at::Tensor&)>;
const View kSame = [](const at::Tensor& x) { return x; };

template <typename Product>
Grads Run(const at::Tensor& x0, const View& view_x, const at::Tensor& w0, const View& view_w, const at::Tensor& grad,
          Product product) {
  at::Tensor x = x0.detach().clone().requires_grad_(), w = w0.detach().clone().requires_grad_();
  at::Tensor out = product(view_x(x), view_w(w));
  out.backward(grad.to(out.scalar_type()));
  return {out.detach(), x.grad(), w.grad()};
}

// |got - want| relative to the float64 result's scale: fp32 products of K
// terms carry errors of a few ulps of the largest partial sums.
double RelativeError(const at::Tensor& got, const at::Tensor& want64) {
  const double scale = want64.abs().max().item<double>();
  return got.to(at::kDouble).sub(want64).abs().max().item<double>() / std::max(scale, 1e-30);
}

void ExpectClose(const char* name, const at::Tensor& x, const View& view_x, const at::Tensor& w, const View& view_w) {
  at::Tensor probe = at::linear(view_x(x), view_w(w));
  const at::Tensor grad = at::randn(probe.sizes());
  const auto linear = [](const at::Tensor& a, const at::Tensor& b) { return Linear(a, b); };
  const auto torch_linear = [](const at::Tensor& a, const at::Tensor& b) { return at::linear(a, b); };
  const Grads got = Run(x, view_x, w, view_w, grad, linear);
  const Grads blas = Run(x, view_x, w, view_w, grad, torch_linear);
  const Grads want = Run(x.to(at::kDouble), view_x, w.to(at::kDouble), view_w, grad, torch_linear);
  const double eo = RelativeError(got.out, want.out), ex = RelativeError(got.dx, want.dx),
               ew = RelativeError(got.dw, want.dw);
  const double bo = RelativeError(blas.out, want.out), bx = RelativeError(blas.dx, want.dx),
               bw = RelativeError(blas.dw, want.dw);
  std::printf("%-34s relative error vs float64: Linear out %.1e dx %.1e dw %.1e | at::linear out %.1e dx %.1e dw %.1e;"
              " bit for bit at::linear's: %s\n",
              name, eo, ex, ew, bo, bx, bw,
              got.out.equal(blas.out) && got.dx.equal(blas.dx) && got.dw.equal(blas.dw) ? "yes" : "no");
  EXPECT_EQ(got.out.sizes(), want.out.sizes()) << name;
  // fp32 with K up to 1024: within 2e-6 of the largest value (a few ulps of
  // the partial sums), and no worse than 4x what OpenBLAS gives.
  for (const auto& [err, base] : {std::pair{eo, bo}, {ex, bx}, {ew, bw}}) {
    EXPECT_LT(err, 2e-6) << name;
    EXPECT_LE(err, std::max(4 * base, 1e-7)) << name;
  }
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
