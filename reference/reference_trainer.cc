#include "reference/reference_trainer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>

#include <chrono>

#include "strategies/job_spec.h"
#include "worker/model/adamw.h"
#include "worker/model/init.h"
#include "common/exceptions.h"

namespace baton {

ReferenceTrainer::ReferenceTrainer(baton::v1::JobSpec job, std::unique_ptr<DataSource> data)
    : job_(std::move(job)), layout_(BuildModelLayout(job_.model())), data_(std::move(data)) {
  for (const auto& unit : layout_.units) {
    for (const auto& p : unit.params) {
      at::Tensor t = InitParamPiece(p.name, p.shape, Piece{std::vector<int64_t>(p.shape.size(), 0), p.shape},
                                    p.init, job_.seed());
      params_[p.name] = t.set_requires_grad(true);
      grads_[p.name] = at::zeros_like(t);
      exp_avg_[p.name] = at::zeros_like(t);
      exp_avg_sq_[p.name] = at::zeros_like(t);
    }
  }
}

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    const baton::v1::JobSpec& job) {
  auto data = DataSource::Open(job.data(), job.model(), job.seed());
  if (!data.ok()) return data.status();
  return std::unique_ptr<ReferenceTrainer>(new ReferenceTrainer(job, std::move(*data)));
}

std::vector<std::string> ReferenceTrainer::param_names() const {
  std::vector<std::string> names;
  for (const auto& unit : layout_.units) {
    for (const auto& p : unit.params) names.push_back(p.name);
  }
  return names;
}

absl::StatusOr<baton::v1::StepMetrics> ReferenceTrainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  ++step_;
  // The rows as the job's data-parallel ranks take them, one rank after
  // another: each accumulates its microbatches' gradients as a worker's
  // autograd does; the ranks' gradients are summed in rank order and divided
  // by their number, as the workers' AVG reductions (SUM in rank order, then
  // the division) do. A gradient near AdamW's eps amplifies any other order
  // of the same sums into ~1e-5 of drift within ten steps
  // (reference_arithmetic_test).
  const int64_t batch = job_.data().batch_size();
  const int microbatches = job_.data().microbatches();
  const int ranks = BatchParallelSize(job_);
  const int64_t rows_per_rank = batch / ranks, rows = rows_per_rank / microbatches;
  auto lookup = [this](const std::string& name) -> const at::Tensor& { return params_.at(name); };
  double loss_sum = 0;
  int64_t peak_logits = 0;
  try {
    for (int r = 0; r < ranks; ++r) {
      for (int mb = 0; mb < microbatches; ++mb) {
        Batch b = data_->Get(step_, r * rows_per_rank + mb * rows, rows);
        at::Tensor x;
        for (const auto& stage : layout_.stages) {
          const std::string unit = stage.unit() < 0 ? "" : layout_.units[stage.unit()].name;
          int64_t logits = 0;
          x = StageForward(stage, job_.model(), unit, lookup, x, b, at::kFloat, nullptr, &logits);
          peak_logits = std::max(peak_logits, logits);
        }
        loss_sum += x.item<double>();
        x.div(static_cast<double>(microbatches)).backward();
      }
      for (auto& [name, p] : params_) {
        if (!p.grad().defined()) {  // not reached: a zero gradient, as on a worker
          if (r == 0) grads_[name].zero_();
          continue;
        }
        if (r == 0) {
          grads_[name].copy_(p.grad());
        } else {
          grads_[name].add_(p.grad());
        }
        p.mutable_grad().reset();
      }
    }
    if (ranks > 1) {
      for (auto& [name, g] : grads_) g.div_(ranks);
    }
    baton::v1::StepMetrics m;
    m.set_step(static_cast<int32_t>(step_));
    m.set_loss(loss_sum / (static_cast<double>(microbatches) * ranks));
    m.set_has_loss(true);
    double sq = 0;
    for (const auto& [name, g] : grads_) sq += SumOfSquares(g);
    const double norm = std::sqrt(sq);
    m.set_grad_norm(norm);
    if (job_.optimizer().max_grad_norm() > 0) {
      const double coef = ClipCoefficient(norm, job_.optimizer().max_grad_norm());
      if (coef < 1.0) {
        for (auto& [name, g] : grads_) g.mul_(coef);
      }
    }
    {
      at::NoGradGuard no_grad;
      for (auto& [name, p] : params_) {
        at::Tensor data = p.detach();
        AdamWUpdate(data, grads_[name], exp_avg_[name], exp_avg_sq_[name], step_, job_.optimizer());
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    m.set_step_ms(seconds * 1e3);
    m.set_tokens(batch * layout_.tokens_per_row);
    m.set_tokens_per_s(m.tokens() / seconds);
    int64_t state = 0;
    for (const auto& [name, p] : params_) state += 16 * p.numel();
    m.set_state_bytes(state);
    m.set_peak_unsharded_param_bytes(layout_.parameters() * 4);
    m.set_peak_logits_elements(peak_logits);
    return m;
  } catch (const std::exception& e) {
    return absl::InternalError("reference step failed: " + FirstLine(e));
  }
}

}  // namespace baton
