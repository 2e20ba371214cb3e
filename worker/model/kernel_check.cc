#include "worker/model/kernel_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace baton::kernel_check {
namespace {

bool SameOrBothUndefined(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || a.equal(b));
}

}  // namespace

const View kSame = [](const at::Tensor& x) { return x; };

bool Grads::Equal(const Grads& other) const {
  return SameOrBothUndefined(out, other.out) && SameOrBothUndefined(dx, other.dx) &&
         SameOrBothUndefined(dw, other.dw);
}

Grads RunWithGradients(const at::Tensor& x0, const View& view_x, const at::Tensor& w0, const View& view_w,
                       const at::Tensor& grad, const Function& f) {
  at::Tensor x = x0.detach().clone().requires_grad_();
  at::Tensor w = w0.defined() ? w0.detach().clone().requires_grad_() : at::Tensor();
  at::Tensor out = f(view_x(x), w.defined() ? view_w(w) : w);
  out.backward(grad.to(out.scalar_type()));
  return {out.detach(), x.grad(), w.defined() ? w.grad() : at::Tensor()};
}

double RelativeError(const at::Tensor& got, const at::Tensor& want64) {
  const double scale = std::max(want64.abs().max().item<double>(), 1e-30);
  return got.to(at::kDouble).sub(want64).abs().max().item<double>() / scale;
}

void ExpectNearFloat64(const char* name, const char* kernel, const Grads& got, const char* baseline,
                       const Grads& base, const Grads& want64, double limit, double floor) {
  EXPECT_EQ(got.out.sizes(), want64.out.sizes()) << name;
  std::string line;
  for (const auto& [label, g, b, w] : {std::tuple{"out", got.out, base.out, want64.out},
                                       {"dx", got.dx, base.dx, want64.dx}, {"dw", got.dw, base.dw, want64.dw}}) {
    if (!w.defined()) continue;
    const double err = RelativeError(g, w), base_err = RelativeError(b, w);
    char part[96];
    std::snprintf(part, sizeof part, " %s %.1e (%s %.1e)", label, err, baseline, base_err);
    line += part;
    EXPECT_LT(err, limit) << name << " " << label;
    EXPECT_LE(err, std::max(4 * base_err, floor)) << name << " " << label;
  }
  std::printf("%-34s %s relative error vs float64:%s\n", name, kernel, line.c_str());
}

}  // namespace baton::kernel_check
