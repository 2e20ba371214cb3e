// The single-process reference: the same model, initial weights, data and
// AdamW as a sharded run, in one process with full tensors, built on the
// worker's model code (stages, init, AdamW). The sharded tests compare
// parameters, gradients and losses with it; the PyTorch-Python oracle
// (tests/oracle/) checks that shared code independently.
//
// Not thread-safe.
#ifndef BATON_REFERENCE_REFERENCE_TRAINER_H_
#define BATON_REFERENCE_REFERENCE_TRAINER_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "models/model.h"
#include "worker/model/data.h"

namespace baton {

class ReferenceTrainer {
 public:
  // `job` validated, defaults applied.
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(const baton::v1::JobSpec& job);

  // Runs step `step_` + 1 over the whole global batch, split as the job's
  // data-parallel ranks and microbatches split it, with the ranks' gradients
  // combined as the workers' reductions combine them, and returns its
  // metrics. Gradients stay readable until the
  // next step.
  absl::StatusOr<baton::v1::StepMetrics> Step();

  int64_t step() const { return step_; }
  const at::Tensor& param(const std::string& name) const { return params_.at(name); }
  const at::Tensor& grad(const std::string& name) const { return grads_.at(name); }
  std::vector<std::string> param_names() const;
  const ModelLayout& layout() const { return layout_; }

 private:
  ReferenceTrainer(baton::v1::JobSpec job, std::unique_ptr<DataSource> data);

  baton::v1::JobSpec job_;
  ModelLayout layout_;
  std::unique_ptr<DataSource> data_;
  std::map<std::string, at::Tensor> params_, grads_, exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace baton

#endif  // BATON_REFERENCE_REFERENCE_TRAINER_H_
