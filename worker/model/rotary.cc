#include "worker/model/rotary.h"

#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/model/vec.h"

namespace baton {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
using vec::kLanes;
using vec::Load;
using vec::Store;
using vec::SwapPairs;

// A Vec never crosses a call (the helpers are inlined); GCC reports it anyway,
// for the clones, once the file has been read: off for the whole file.
#pragma GCC diagnostic ignored "-Wpsabi"

// `rows` rows of `n` (even) features, row r at x + r * x_stride, turned by
// table row r: forward out = x cos + swap(x) sin; backward (x the output's
// gradient) out = x cos + swap(x sin), what the operators' gradients sum to.
BATON_VECTOR_CLONES void RotateRows(const float* x, int64_t x_stride, const float* cos, const float* sin, int64_t rows,
                                    int64_t n, bool backward, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * x_stride;
    const float* c = cos + r * n;
    const float* s = sin + r * n;
    float* o = out + r * out_stride;
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      const vec::Vec v = Load(in + j);
      Store(o + j, backward ? v * Load(c + j) + SwapPairs(v * Load(s + j))
                            : v * Load(c + j) + SwapPairs(v) * Load(s + j));
    }
    for (; j < n; j += 2) {
      if (backward) {
        o[j] = in[j] * c[j] + in[j + 1] * s[j + 1];
        o[j + 1] = in[j + 1] * c[j + 1] + in[j] * s[j];
      } else {
        o[j] = in[j] * c[j] + in[j + 1] * s[j];
        o[j + 1] = in[j + 1] * c[j + 1] + in[j] * s[j + 1];
      }
    }
  }
}

// x [batch, heads, seq, n] with unit feature stride into a new tensor of
// x's layout, one task per (batch, head) slab of seq rows.
at::Tensor RotateTensor(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  at::Tensor out = at::empty_like(x);  // x's layout (dense, non-overlapping)
  const int64_t heads = x.size(1), seq = x.size(2), n = x.size(3);
  const float* px = x.data_ptr<float>();
  const float* pc = cos.data_ptr<float>();
  const float* ps = sin.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, x.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slab = begin; slab < end; ++slab) {
      const int64_t b = slab / heads, h = slab % heads;
      RotateRows(px + b * x.stride(0) + h * x.stride(1), x.stride(2), pc, ps, seq, n, backward,
                 po + b * out.stride(0) + h * out.stride(1), out.stride(2));
    }
  });
  return out;
}

class RotateFunction : public torch::autograd::Function<RotateFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return RotateTensor(x, cos, sin, /*backward=*/false);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = grads[0];
    if (g.stride(-1) != 1 || !g.is_non_overlapping_and_dense()) g = g.contiguous();
    return {RotateTensor(g, saved[0], saved[1], /*backward=*/true), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> RotaryTables(const at::Tensor& positions, int64_t head_dim, double theta) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(positions.device());
  const at::Tensor exponents = at::arange(0, 2 * (head_dim / 2), 2, f32).div(static_cast<double>(head_dim));
  const at::Tensor inverse = at::reciprocal(at::pow(at::Scalar(theta), exponents));
  const at::Tensor angles = positions.to(at::kFloat).unsqueeze(1).mul(inverse);
  const at::Tensor cos = at::cos(angles), sin = at::sin(angles);
  return {at::stack({cos, cos}, -1).flatten(-2), at::stack({sin.neg(), sin}, -1).flatten(-2)};
}

at::Tensor RotateByOperators(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor pairs = x.narrow(-1, 0, 2 * half).to(at::kFloat);
  const at::Tensor swapped = pairs.unflatten(-1, {half, 2}).flip(-1).flatten(-2);
  at::Tensor turned = pairs.mul(cos).add(swapped.mul(sin)).to(x.scalar_type());
  if (2 * half == x.size(-1)) return turned;
  return at::cat({turned, x.narrow(-1, 2 * half, 1)}, -1);
}

at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const bool plain = x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu() && x.size(-1) % 2 == 0 &&
                     x.stride(-1) == 1 && x.is_non_overlapping_and_dense() && x.numel() > 0 &&
                     cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                     sin.scalar_type() == at::kFloat && cos.dim() == 2 && cos.size(0) == x.size(2) &&
                     cos.size(1) == x.size(3) && sin.sizes() == cos.sizes();
  if (!plain) return RotateByOperators(x, cos, sin);
  return RotateFunction::apply(x, cos, sin);
}

}  // namespace baton
