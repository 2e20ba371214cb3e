#include "worker/model/rms_norm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows per task when a rank runs more than one thread.
constexpr int64_t kGrain = 64;

// Sixteen floats, for GCC's and Clang's vector extensions: the loops below
// are written lane-wise, so each runs as vector instructions (at -O2 GCC left
// them scalar) in the same order of operations on every machine. Each comes
// in AVX-512, AVX2 and baseline (SSE2) builds, chosen when the process loads
// (target_clones); none of them fuses a multiply and an add, so all three
// give the same bits.
using Vec = float __attribute__((vector_size(64)));
constexpr int64_t kLanes = sizeof(Vec) / sizeof(float);
#define BATON_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // Vec never crosses a call: Load and Store are inlined
[[gnu::always_inline]] inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// The lanes of `v` added pairwise (lane k plus lane k + half, halving), in
// registers: through memory, a wide store read back one float at a time
// stalls on every read.
using Vec8 = float __attribute__((vector_size(32)));
using Vec4 = float __attribute__((vector_size(16)));

[[gnu::always_inline]] inline float AddLanes(Vec v) {
  Vec8 lo8, hi8;
  std::memcpy(&lo8, &v, sizeof lo8);
  std::memcpy(&hi8, reinterpret_cast<const char*>(&v) + sizeof lo8, sizeof hi8);
  const Vec8 eight = lo8 + hi8;
  Vec4 lo4, hi4;
  std::memcpy(&lo4, &eight, sizeof lo4);
  std::memcpy(&hi4, reinterpret_cast<const char*>(&eight) + sizeof lo4, sizeof hi4);
  const Vec4 four = lo4 + hi4;
  return (four[0] + four[2]) + (four[1] + four[3]);
}

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
BATON_CLONES void ForwardRows(const float* x, const float* weight, float eps, int64_t n, int64_t begin, int64_t end,
                              float* y, float* r) {
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
BATON_CLONES void InputGradientRows(const float* g, const float* weight, const float* x, const float* r, int64_t n,
                                    int64_t begin, int64_t end, float* dx) {
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
BATON_CLONES void AddWeightGradientRows(const float* g, const float* x, const float* r, int64_t n, int64_t begin,
                                        int64_t end, float* sum) {
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
#undef BATON_CLONES

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
