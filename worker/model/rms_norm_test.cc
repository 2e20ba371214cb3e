// RmsNorm (one pass per row) against LibTorch's operators in float64, which
// share no code with it, on outputs and both gradients; against the fp32
// operators; the same bits with one thread or two; the other dtypes keep the
// operators.
#include "worker/model/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "gtest/gtest.h"
#include "worker/model/kernel_check.h"

namespace baton {
namespace {

using kernel_check::Grads;
using kernel_check::kSame;
using kernel_check::View;

using Norm = at::Tensor (*)(const at::Tensor&, const at::Tensor&, double);

Grads Normalise(const at::Tensor& x, const View& view, const at::Tensor& w, const at::Tensor& grad, double eps,
                Norm norm) {
  return kernel_check::RunWithGradients(x, view, w, kSame, grad,
                                        [&](const at::Tensor& a, const at::Tensor& b) { return norm(a, b, eps); });
}

void ExpectClose(const char* name, const at::Tensor& x, const View& view, const at::Tensor& w, double eps) {
  const at::Tensor grad = at::randn(view(x).sizes());
  const Grads got = Normalise(x, view, w, grad, eps, RmsNorm);
  const Grads ops = Normalise(x, view, w, grad, eps, RmsNormByOperators);
  const Grads want = Normalise(x.to(at::kDouble), view, w.to(at::kDouble), grad, eps, RmsNormByOperators);
  // fp32: a few ulps of each tensor's largest value, and no worse than the
  // operators' own rounding allows.
  kernel_check::ExpectNearFloat64(name, "RmsNorm", got, "operators", ops, want, 1e-6, 2e-7);
}

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
  EXPECT_TRUE(one.Equal(two));
}

TEST(RmsNormTest, OtherDtypesKeepTheOperators) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({4, 8, 16}).to(at::kBFloat16), w = at::randn({16}).to(at::kBFloat16);
  EXPECT_TRUE(RmsNorm(x, w, 1e-5).equal(RmsNormByOperators(x, w, 1e-5)));
}

}  // namespace
}  // namespace baton
