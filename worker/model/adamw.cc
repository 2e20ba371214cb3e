#include "worker/model/adamw.h"

#include <algorithm>
#include <cmath>

namespace baton {

void AdamWUpdate(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                 at::Tensor& exp_avg_sq, int64_t step, const baton::v1::OptimizerSpec& opt) {
  if (param.numel() == 0) return;
  const double lr = opt.lr(), beta1 = opt.beta1(), beta2 = opt.beta2();
  param.mul_(1.0 - lr * opt.weight_decay());
  exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  at::Tensor denom = exp_avg_sq.sqrt().div_(std::sqrt(bias_correction2)).add_(opt.eps());
  param.addcdiv_(exp_avg, denom, -step_size);
}

double ClipCoefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace baton
