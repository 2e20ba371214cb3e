// RmsNorm (one pass per row) against LibTorch's operators in float64, which
// share no code with it, on outputs and both gradients; against the fp32
// operators; the same bits with one thread or two; the other dtypes keep the
// operators.
#include "worker/model/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <functional>

#include "gtest/gtest.h"

namespace baton {
namespace {

struct Grads {
  at::Tensor out, dx, dw;
};

using Norm = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, double)>;
using View = std::function<at::Tensor(const at::Tensor&)>;

Grads Normalise(const at::Tensor& x0, const View& view, const at::Tensor& w0, const at::Tensor& grad, double eps,
          const Norm& norm) {
  at::Tensor x = x0.detach().clone().requires_grad_(), w = w0.detach().clone().requires_grad_();
  at::Tensor out = norm(view(x), w, eps);
  out.backward(grad.to(out.scalar_type()));
  return {out.detach(), x.grad(), w.grad()};
}

double RelativeError(const at::Tensor& got, const at::Tensor& want64) {
  const double scale = std::max(want64.abs().max().item<double>(), 1e-30);
  return got.to(at::kDouble).sub(want64).abs().max().item<double>() / scale;
}

void ExpectClose(const char* name, const at::Tensor& x, const View& view, const at::Tensor& w, double eps) {
  const at::Tensor grad = at::randn(view(x).sizes());
  const Grads got = Normalise(x, view, w, grad, eps, RmsNorm);
  const Grads ops = Normalise(x, view, w, grad, eps, RmsNormByOperators);
  const Grads want = Normalise(x.to(at::kDouble), view, w.to(at::kDouble), grad, eps, RmsNormByOperators);
  const double eo = RelativeError(got.out, want.out), ex = RelativeError(got.dx, want.dx),
               ew = RelativeError(got.dw, want.dw);
  const double oo = RelativeError(ops.out, want.out), ox = RelativeError(ops.dx, want.dx),
               ow = RelativeError(ops.dw, want.dw);
  std::printf("%-30s relative error vs float64: RmsNorm out %.1e dx %.1e dw %.1e"
              " | operators out %.1e dx %.1e dw %.1e\n",
              name, eo, ex, ew, oo, ox, ow);
  EXPECT_EQ(got.out.sizes(), want.out.sizes()) << name;
  // fp32: a few ulps of each tensor's largest value, and no worse than the
  // operators' own rounding allows.
  for (const auto& [err, base] : {std::pair{eo, oo}, {ex, ox}, {ew, ow}}) {
    EXPECT_LT(err, 1e-6) << name;
    EXPECT_LE(err, std::max(4 * base, 2e-7)) << name;
  }
}

const View kSame = [](const at::Tensor& x) { return x; };

TEST(RmsNormTest, MatchesFloat64) {
  at::manual_seed(5);
  ExpectClose("decoder activations [4, 16, 32]", at::randn({4, 16, 32}), kSame, at::randn({32}), 1e-5);
  ExpectClose("an odd dim [2, 3, 5, 7]", at::randn({2, 3, 5, 7}), kSame, at::randn({7}), 1e-6);
  ExpectClose("one row", at::randn({1, 96}), kSame, at::randn({96}), 1e-5);
  const View transposed = [](const at::Tensor& x) { return x.transpose(0, 1); };
  ExpectClose("a transposed (strided) input", at::randn({16, 4, 24}), transposed, at::randn({24}), 1e-5);
  // Where eps matters: rows of tiny values.
  ExpectClose("tiny values (eps dominates)", at::randn({8, 64}).mul(1e-3), kSame, at::randn({64}), 1e-5);
  ExpectClose("large values", at::randn({8, 64}).mul(1e3), kSame, at::randn({64}), 1e-5);
  // The weight's gradient sums over every row: a long sequence's worth.
  ExpectClose("32768 rows (a long sequence)", at::randn({4, 8192, 16}), kSame, at::randn({16}), 1e-5);
}

TEST(RmsNormTest, SameBitsWithOneThreadOrTwo) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({8, 64, 48}), w = at::randn({48}), grad = at::randn({8, 64, 48});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Grads one = Normalise(x, kSame, w, grad, 1e-5, RmsNorm);
  at::set_num_threads(2);
  const Grads two = Normalise(x, kSame, w, grad, 1e-5, RmsNorm);
  at::set_num_threads(threads);
  EXPECT_TRUE(one.out.equal(two.out) && one.dx.equal(two.dx) && one.dw.equal(two.dw));
}

TEST(RmsNormTest, OtherDtypesKeepTheOperators) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({4, 8, 16}).to(at::kBFloat16), w = at::randn({16}).to(at::kBFloat16);
  EXPECT_TRUE(RmsNorm(x, w, 1e-5).equal(RmsNormByOperators(x, w, 1e-5)));
}

}  // namespace
}  // namespace baton
