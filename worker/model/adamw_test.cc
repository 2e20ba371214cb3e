// The one-pass AdamW update against the tensor-op form (torch.optim.AdamW's
// single-tensor algorithm, which the oracle tests hold to PyTorch-Python),
// and a shard's update against its slice of the full one.
#include "worker/model/adamw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace baton {
namespace {

baton::v1::OptimizerSpec Spec() {
  baton::v1::OptimizerSpec spec;
  spec.set_lr(3e-3);
  spec.set_beta1(0.9);
  spec.set_beta2(0.999);
  spec.set_eps(1e-8);
  spec.set_weight_decay(0.01);
  return spec;
}

struct State {
  at::Tensor param, exp_avg, exp_avg_sq;
  State Clone() const { return {param.clone(), exp_avg.clone(), exp_avg_sq.clone()}; }
};

State Random(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  return {at::randn({n}), at::zeros({n}), at::zeros({n})};
}

// AdamW in double precision, written out from its definition (Loshchilov &
// Hutter; torch.optim.AdamW's documentation), sharing nothing with the code
// under test: the yardstick both float forms are measured against.
struct Exact {
  std::vector<double> param, m, v;
  void Step(const at::Tensor& grad, int64_t t, const baton::v1::OptimizerSpec& o) {
    const float* g = grad.data_ptr<float>();
    for (size_t i = 0; i < param.size(); ++i) {
      param[i] *= 1 - o.lr() * o.weight_decay();
      m[i] = o.beta1() * m[i] + (1 - o.beta1()) * g[i];
      v[i] = o.beta2() * v[i] + (1 - o.beta2()) * static_cast<double>(g[i]) * g[i];
      const double m_hat = m[i] / (1 - std::pow(o.beta1(), t));
      const double v_hat = v[i] / (1 - std::pow(o.beta2(), t));
      param[i] -= o.lr() * m_hat / (std::sqrt(v_hat) + o.eps());
    }
  }
};

// The largest error against the exact parameters, in units of the
// parameter step size (lr): how far a float form wandered.
double MaxError(const at::Tensor& param, const std::vector<double>& exact, double lr) {
  const float* p = param.data_ptr<float>();
  double most = 0;
  for (size_t i = 0; i < exact.size(); ++i) most = std::max(most, std::abs(p[i] - exact[i]) / lr);
  return most;
}

TEST(AdamW, OnePassIsAsAccurateAsTheTensorOps) {
  // Odd length: the vectorised loop's tail is exercised too.
  constexpr int64_t kN = 100003;
  const auto spec = Spec();
  State fused = Random(kN, 7), ops = fused.Clone();
  const at::Tensor start = fused.param.clone();
  const float* p0 = start.data_ptr<float>();
  Exact exact{std::vector<double>(p0, p0 + kN), std::vector<double>(kN, 0.0), std::vector<double>(kN, 0.0)};
  for (int64_t step = 1; step <= 20; ++step) {
    at::manual_seed(100 + step);
    const at::Tensor grad = at::randn({kN}) * 0.1;
    AdamWUpdate(fused.param, grad, fused.exp_avg, fused.exp_avg_sq, step, spec);
    AdamWUpdateTensorOps(ops.param, grad, ops.exp_avg, ops.exp_avg_sq, step, spec);
    exact.Step(grad, step, spec);
  }
  const double fused_error = MaxError(fused.param, exact.param, spec.lr());
  const double ops_error = MaxError(ops.param, exact.param, spec.lr());
  const double between = (fused.param - ops.param).abs().max().item<double>() / spec.lr();
  std::printf("20 steps of %lld parameters, largest error against double precision in units of lr: "
              "one pass %.3g, tensor ops %.3g (apart %.3g)\n",
              static_cast<long long>(kN), fused_error, ops_error, between);
  // Float rounding over 20 steps stays far below one step's size, and the
  // one pass is no less accurate than PyTorch's kernels.
  EXPECT_LT(fused_error, 1e-2);
  EXPECT_LE(fused_error, 2 * ops_error + 1e-4);
  EXPECT_FALSE(at::equal(fused.param, start)) << "the update changed nothing";
}

TEST(AdamW, AShardsUpdateIsItsSliceOfTheFullUpdate) {
  constexpr int64_t kN = 10007;
  const auto spec = Spec();
  State full = Random(kN, 11);
  // Uneven shards starting at offsets no vector width divides.
  const std::vector<int64_t> bounds = {0, 3, 1001, 5003, 9998, kN};
  std::vector<State> shards;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const int64_t len = bounds[s + 1] - bounds[s];
    shards.push_back({full.param.narrow(0, bounds[s], len).clone(), full.exp_avg.narrow(0, bounds[s], len).clone(),
                      full.exp_avg_sq.narrow(0, bounds[s], len).clone()});
  }
  for (int64_t step = 1; step <= 5; ++step) {
    at::manual_seed(200 + step);
    const at::Tensor grad = at::randn({kN});
    AdamWUpdate(full.param, grad, full.exp_avg, full.exp_avg_sq, step, spec);
    for (size_t s = 0; s < shards.size(); ++s) {
      const at::Tensor piece = grad.narrow(0, bounds[s], bounds[s + 1] - bounds[s]).contiguous();
      AdamWUpdate(shards[s].param, piece, shards[s].exp_avg, shards[s].exp_avg_sq, step, spec);
    }
  }
  int identical = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const int64_t len = bounds[s + 1] - bounds[s];
    const bool same = at::equal(shards[s].param, full.param.narrow(0, bounds[s], len)) &&
                      at::equal(shards[s].exp_avg, full.exp_avg.narrow(0, bounds[s], len)) &&
                      at::equal(shards[s].exp_avg_sq, full.exp_avg_sq.narrow(0, bounds[s], len));
    EXPECT_TRUE(same) << "shard [" << bounds[s] << ", " << bounds[s + 1] << ")";
    identical += same;
  }
  std::printf("%d of %zu uneven shards bit-identical to their slice of the full update after 5 steps\n", identical,
              shards.size());
}

TEST(AdamW, TheThreadCountDoesNotChangeTheBits) {
  // Long enough for the pass to split over threads (chunks of 32768), odd so
  // that chunk boundaries fall mid-vector.
  constexpr int64_t kN = 3 * 32768 + 4099;
  const auto spec = Spec();
  State one = Random(kN, 13), many = one.Clone();
  const int before = at::get_num_threads();
  for (int64_t step = 1; step <= 3; ++step) {
    at::manual_seed(300 + step);
    const at::Tensor grad = at::randn({kN});
    at::set_num_threads(1);
    AdamWUpdate(one.param, grad, one.exp_avg, one.exp_avg_sq, step, spec);
    at::set_num_threads(3);
    AdamWUpdate(many.param, grad, many.exp_avg, many.exp_avg_sq, step, spec);
  }
  const int threads = at::get_num_threads();
  at::set_num_threads(before);
  const bool same = at::equal(one.param, many.param) && at::equal(one.exp_avg, many.exp_avg) &&
                    at::equal(one.exp_avg_sq, many.exp_avg_sq);
  std::printf("%lld parameters, 3 steps on 1 thread and on %d: %s\n", static_cast<long long>(kN), threads,
              same ? "bit-identical" : "DIFFERENT");
  EXPECT_TRUE(same);
  EXPECT_FALSE(at::equal(one.param, Random(kN, 13).param)) << "the update changed nothing";
}

TEST(AdamW, AStridedViewTakesTheTensorOps) {
  // A column of a matrix is not contiguous: updated through the tensor
  // ops, in place, to the same values as a contiguous copy's update.
  constexpr int64_t kRows = 513;
  const auto spec = Spec();
  at::manual_seed(3);
  at::Tensor matrix = at::randn({kRows, 2});
  at::Tensor column = matrix.select(1, 0);
  at::Tensor m = at::zeros({kRows}), v = at::zeros({kRows});
  at::Tensor copy = column.contiguous().clone(), m2 = m.clone(), v2 = v.clone();
  const at::Tensor grad = at::randn({kRows});
  ASSERT_FALSE(column.is_contiguous());
  AdamWUpdate(column, grad, m, v, 1, spec);
  AdamWUpdateTensorOps(copy, grad, m2, v2, 1, spec);
  EXPECT_TRUE(at::equal(matrix.select(1, 0), copy));
  std::printf("strided column of %lld updated in place: %s\n", static_cast<long long>(kRows),
              at::equal(matrix.select(1, 0), copy) ? "equal to the tensor ops" : "DIFFERENT");
}

TEST(AdamW, SumOfSquaresIsTheDoublePrecisionSum) {
  // Odd length (the accumulators' tail), and a strided view (tensor ops).
  at::manual_seed(5);
  const at::Tensor g = at::randn({100003});
  const double exact = g.to(at::kDouble).square().sum().item<double>();
  const double mine = SumOfSquares(g);
  const at::Tensor column = at::randn({4001, 3}).select(1, 1);
  const double strided = SumOfSquares(column), strided_exact = column.to(at::kDouble).square().sum().item<double>();
  std::printf("sum of squares of %d elements: %.17g vs %.17g (relative %.3g); strided %.17g vs %.17g\n", 100003, mine,
              exact, std::abs(mine / exact - 1), strided, strided_exact);
  EXPECT_NEAR(mine / exact, 1.0, 1e-12);
  EXPECT_NEAR(strided / strided_exact, 1.0, 1e-12);
  EXPECT_EQ(SumOfSquares(at::zeros({0})), 0.0);
}

}  // namespace
}  // namespace baton
