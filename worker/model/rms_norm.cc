#include "worker/model/rms_norm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/model/vec.h"

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows per task when a rank runs more than one thread.
constexpr int64_t kGrain = 64;

using vec::AddLanes;
using vec::kLanes;
using vec::Load;
using vec::Store;
using vec::Vec;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // a Vec never crosses a call: the helpers are inlined
// sum of a[j] * b[j] (* c[j] when c is given): a vector of partial sums over
// the row, the tail added to its first lanes, then its lanes added pairwise:
// a fixed order.
[[gnu::always_inline]] inline float Dot(const float* a, const float* b, const float* c, int64_t n) {
  Vec sums = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const Vec ab = Load(a + j) * Load(b + j);
    sums += c == nullptr ? ab : ab * Load(c + j);
  }
  for (int64_t k = 0; j < n; ++j, ++k) sums[k] += c == nullptr ? a[j] * b[j] : (a[j] * b[j]) * c[j];
  return AddLanes(sums);
}

// The kernels below each take a range of rows, so that the process stays in
// one instruction set per range (switching between the clones' AVX code and
// the baseline's SSE code row by row stalled on every switch).

// Rows [begin, end): r = 1 / sqrt(mean(x^2) + eps), y = (x r) weight.
BATON_VECTOR_CLONES void ForwardRows(const float* x, const float* weight, float eps, int64_t n, int64_t begin,
                                     int64_t end, float* y, float* r) {
  for (int64_t i = begin; i < end; ++i) {
    const float* row = x + i * n;
    const float ri = 1.0f / std::sqrt(Dot(row, row, nullptr, n) / static_cast<float>(n) + eps);
    r[i] = ri;
    float* out = y + i * n;
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) Store(out + j, (Load(row + j) * ri) * Load(weight + j));
    for (; j < n; ++j) out[j] = (row[j] * ri) * weight[j];
  }
}

// Rows [begin, end) of dx = r (g weight) - x c, c = r^3 mean(g weight x).
BATON_VECTOR_CLONES void InputGradientRows(const float* g, const float* weight, const float* x, const float* r,
                                           int64_t n, int64_t begin, int64_t end, float* dx) {
  for (int64_t i = begin; i < end; ++i) {
    const float* grow = g + i * n;
    const float* row = x + i * n;
    const float ri = r[i];
    const float c = ri * ri * ri * (Dot(grow, weight, row, n) / static_cast<float>(n));
    float* out = dx + i * n;
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) Store(out + j, ri * (Load(grow + j) * Load(weight + j)) - Load(row + j) * c);
    for (; j < n; ++j) out[j] = ri * (grow[j] * weight[j]) - row[j] * c;
  }
}

// Rows [begin, end) of the weight's gradient, sum over rows of (g r) x,
// added to `sum` in row order (a block's worth; WeightGradient adds blocks up).
BATON_VECTOR_CLONES void AddWeightGradientRows(const float* g, const float* x, const float* r, int64_t n,
                                               int64_t begin, int64_t end, float* sum) {
  for (int64_t i = begin; i < end; ++i) {
    const float* grow = g + i * n;
    const float* row = x + i * n;
    const float ri = r[i];
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) Store(sum + j, Load(sum + j) + (Load(grow + j) * ri) * Load(row + j));
    for (; j < n; ++j) sum[j] += (grow[j] * ri) * row[j];
  }
}
#pragma GCC diagnostic pop

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
    const int64_t dim = xc.size(-1), rows = xc.numel() / dim;
    at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
    at::Tensor r = at::empty({rows}, xc.options());
    const float* px = xc.data_ptr<float>();
    const float* pw = wc.data_ptr<float>();
    float* py = y.data_ptr<float>();
    float* pr = r.data_ptr<float>();
    const float feps = static_cast<float>(eps);
    at::parallel_for(0, rows, kGrain,
                     [&](int64_t begin, int64_t end) { ForwardRows(px, pw, feps, dim, begin, end, py, pr); });
    ctx->save_for_backward({xc, wc, r});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& r = saved[2];
    const at::Tensor g = grads[0].contiguous();
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    const float* px = x.data_ptr<float>();
    const float* pw = weight.data_ptr<float>();
    const float* pr = r.data_ptr<float>();
    const float* pg = g.data_ptr<float>();
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      gx = at::empty_like(x, at::MemoryFormat::Contiguous);
      float* pgx = gx.data_ptr<float>();
      at::parallel_for(0, rows, kGrain,
                       [&](int64_t begin, int64_t end) { InputGradientRows(pg, pw, px, pr, dim, begin, end, pgx); });
    }
    if (ctx->needs_input_grad(1)) {
      // In fp32 over blocks of kGrain rows, the blocks' sums added in
      // float64 (a long sequence's rows summed in one fp32 run would lose
      // digits); in row order, whatever the thread count.
      std::vector<double> total(dim, 0.0);
      std::vector<float> block(dim);
      for (int64_t begin = 0; begin < rows; begin += kGrain) {
        std::fill(block.begin(), block.end(), 0.0f);
        AddWeightGradientRows(pg, px, pr, dim, begin, std::min(rows, begin + kGrain), block.data());
        for (int64_t j = 0; j < dim; ++j) total[j] += block[j];
      }
      gw = at::empty({dim}, weight.options());
      float* pgw = gw.data_ptr<float>();
      for (int64_t j = 0; j < dim; ++j) pgw[j] = static_cast<float>(total[j]);
    }
    return {gx, gw, at::Tensor()};
  }
};

}  // namespace

at::Tensor RmsNormByOperators(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x.mul(x.pow(2).mean({-1}, /*keepdim=*/true).add(eps).rsqrt()).mul(weight);
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool plain = x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.device().is_cpu() &&
                     weight.device().is_cpu() && x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0) &&
                     x.numel() > 0;
  if (!plain) return RmsNormByOperators(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace baton
