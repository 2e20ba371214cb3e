// Rotate (one pass) against LibTorch's operators, bit for bit on outputs and
// gradients, for the model's layout and others; both against the rotation
// written as complex products in float64, which shares no code with either;
// the cases that keep the operators.
#include "worker/model/rotary.h"

#include <ATen/ATen.h>

#include <cstdio>

#include "gtest/gtest.h"
#include "worker/model/kernel_check.h"

namespace baton {
namespace {

using kernel_check::Grads;
using kernel_check::View;

using Turn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&);

Grads Run(const at::Tensor& x, bool model_layout, const at::Tensor& cos, const at::Tensor& sin,
          const at::Tensor& grad, Turn turn) {
  // The model's q and k: [b, t, h, d] memory seen as [b, h, t, d].
  const View layout = model_layout ? View([](const at::Tensor& t) { return t.transpose(1, 2); }) : kernel_check::kSame;
  return kernel_check::RunWithGradients(x, layout, at::Tensor(), kernel_check::kSame, grad,
                                        [&](const at::Tensor& q, const at::Tensor&) { return turn(q, cos, sin); });
}

// (a + i b)(cos + i sin) for each pair, in float64 from the angles alone.
at::Tensor ComplexRotation(const at::Tensor& x, const at::Tensor& positions, int64_t d, double theta) {
  at::Tensor x64 = x.to(at::kDouble), out = at::empty_like(x64);
  for (int64_t i = 0; i < d / 2; ++i) {
    const at::Tensor angle = positions.to(at::kDouble).mul(std::pow(theta, -2.0 * i / d)).view({-1, 1});
    const at::Tensor a = x64.select(-1, 2 * i), b = x64.select(-1, 2 * i + 1);
    out.select(-1, 2 * i).copy_(a.mul(angle.cos().view({-1})).sub(b.mul(angle.sin().view({-1}))));
    out.select(-1, 2 * i + 1).copy_(b.mul(angle.cos().view({-1})).add(a.mul(angle.sin().view({-1}))));
  }
  return out;
}

void ExpectSame(const char* name, int64_t b, int64_t h, int64_t t, int64_t d, bool model_layout) {
  const at::Tensor x = model_layout ? at::randn({b, t, h, d}) : at::randn({b, h, t, d});
  const at::Tensor positions = at::arange(t, at::kLong).add(3);
  const auto [cos, sin] = RotaryTables(positions, d, 10000.0);
  const at::Tensor grad = at::randn({b, h, t, d});
  const Grads ops = Run(x, model_layout, cos, sin, grad, RotateByOperators);
  const Grads got = Run(x, model_layout, cos, sin, grad, Rotate);
  const at::Tensor want = ComplexRotation(model_layout ? x.transpose(1, 2) : x, positions, d, 10000.0);
  const double err = got.out.to(at::kDouble).sub(want).abs().max().item<double>();
  std::printf("%-36s [%lld, %lld, %lld, %lld]: out %s, gradient %s the operators';"
              " max |out - float64 rotation| %.1e\n",
              name, (long long)b, (long long)h, (long long)t, (long long)d,
              got.out.equal(ops.out) ? "bit for bit" : "DIFFERS from",
              got.dx.equal(ops.dx) ? "bit for bit" : "DIFFERS from", err);
  EXPECT_TRUE(got.out.equal(ops.out)) << name;
  EXPECT_TRUE(got.dx.equal(ops.dx)) << name;
  EXPECT_EQ(got.out.sizes(), ops.out.sizes()) << name;
  EXPECT_LT(err, 1e-5) << name;  // fp32 tables and products of values of a few units
}

TEST(RotaryTest, SameBitsAsTheOperators) {
  at::manual_seed(8);
  ExpectSame("the model's layout (head_dim 32)", 2, 4, 16, 32, true);
  ExpectSame("contiguous [b, h, t, d]", 2, 3, 5, 16, false);
  ExpectSame("head_dim 34 (a tail past the lanes)", 1, 2, 7, 34, true);
  ExpectSame("head_dim 2", 3, 2, 4, 2, true);
  ExpectSame("head_dim 128", 1, 2, 9, 128, true);
}

TEST(RotaryTest, OtherCasesKeepTheOperators) {
  at::manual_seed(9);
  const at::Tensor positions = at::arange(6, at::kLong);
  const auto [cos, sin] = RotaryTables(positions, 7, 10000.0);
  const at::Tensor odd = at::randn({1, 2, 6, 7});
  EXPECT_TRUE(Rotate(odd, cos, sin).equal(RotateByOperators(odd, cos, sin))) << "an odd head_dim";
  EXPECT_TRUE(Rotate(odd, cos, sin).select(-1, 6).equal(odd.select(-1, 6))) << "the unpaired feature passes";
  const auto [c8, s8] = RotaryTables(positions, 8, 10000.0);
  const at::Tensor bf16 = at::randn({1, 2, 6, 8}).to(at::kBFloat16);
  EXPECT_TRUE(Rotate(bf16, c8, s8).equal(RotateByOperators(bf16, c8, s8))) << "bf16";
}

}  // namespace
}  // namespace baton
