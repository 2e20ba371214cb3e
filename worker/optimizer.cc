#include "worker/optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>

#include "worker/model/adamw.h"

namespace baton {

double SquaredGradNorm(const ShardStore& store, const std::vector<int>& axes) {
  // On a device every part is summed there and read once (one host
  // synchronisation per step, not one per parameter).
  const bool on_device = !store.device().is_cpu();
  at::Tensor device_sq = on_device ? at::zeros({}, store.options(at::kDouble)) : at::Tensor();
  double sq = 0;
  for (const auto& u : store.units()) {
    for (const auto& p : u->params) {
      const at::Tensor& g = p.PieceGrad();
      if (!g.defined() || g.numel() == 0) continue;
      const double copies = static_cast<double>(store.Copies(p, axes));
      if (on_device) {
        at::Tensor part = g.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true).square_().sum();
        device_sq.add_(copies == 1 ? part : part.div_(copies));
      } else {
        const double part = SumOfSquares(g);
        sq += copies == 1 ? part : part / copies;
      }
    }
  }
  return on_device ? device_sq.item<double>() : sq;
}

absl::StatusOr<double> ClipGradNorm(ShardStore& store, Communicator* group, const std::vector<int>& axes,
                                    double max_norm, Milliseconds timeout) {
  double sq = SquaredGradNorm(store, axes);
  if (group != nullptr) {
    at::Tensor t = at::empty({1}, at::kDouble);
    t.fill_(sq);
    if (auto s = group->AllReduce(t, ReduceOp::kSum, timeout); !s.ok()) return s;
    sq = t.item<double>();
  }
  const double norm = std::sqrt(sq);
  const double coef = ClipCoefficient(norm, max_norm);
  if (coef < 1.0) {
    for (auto& u : store.units()) {
      for (auto& p : u->params) {
        at::Tensor& g = p.PieceGrad();
        if (g.defined()) g.mul_(coef);
      }
    }
  }
  return norm;
}

void AdamWStep(ShardStore& store, const baton::v1::OptimizerSpec& spec, int64_t step, bool keep_last_grads) {
  at::NoGradGuard no_grad;
  for (auto& u : store.units()) {
    for (auto& p : u->params) {
      const at::Tensor& g = p.PieceGrad();
      at::Tensor grad = g.defined() ? g : at::zeros_like(p.master);  // no gradient reached it
      if (keep_last_grads) p.last_grad = grad.clone();
      AdamWUpdate(p.master, grad, p.exp_avg, p.exp_avg_sq, step, spec);
    }
  }
}

}  // namespace baton
