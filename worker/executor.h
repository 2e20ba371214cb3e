// Executor: runs one rank's Program, instruction by instruction, on local
// shards and the communicators of its mesh.
//
// Parameter lifecycle per unit (sharded modes):
//   GATHER  pack the fp32 master shards (cast to the compute dtype) into one
//           flat buffer and all-gather it asynchronously (prefetch)
//   WAIT    copy each rank's rows out into the full parameters (leaf tensors,
//           requires_grad), reallocating their storage
//   FORWARD/BACKWARD  autograd on the unit's stages, input detached per stage
//   FREE    release the full parameters' storage (autograd's saved tensors
//           keep the same storage object, refilled by the next WAIT)
//   REDUCE_SCATTER_GRADS  pack the full fp32 gradients rank-major, reduce-
//           scatter them (AVG = SUM, then our division) into the gradient shard
// AdamW then updates only local shards: optimizer state never exists
// unsharded.
//
// Thread-safety: one thread drives an Executor; collectives run on the
// communicators' own threads.
#ifndef BATON_WORKER_EXECUTOR_H_
#define BATON_WORKER_EXECUTOR_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/program.pb.h"
#include "worker/comm/communicator.h"
#include "worker/model/data.h"

namespace baton {

using CommunicatorMap = std::map<std::string, std::shared_ptr<Communicator>>;

class Executor {
 public:
  // `comms` maps "world" and every mesh axis to this rank's communicator.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const baton::v1::Program& program,
                                                          CommunicatorMap comms);
  ~Executor();

  // Runs step `step` (1-based, consecutive).
  absl::StatusOr<baton::v1::StepMetrics> RunStep(int64_t step, Milliseconds timeout);

  // For tests: keep a copy of each gradient shard as it was right before the
  // optimizer step (off by default: it costs a copy of the gradients).
  void set_keep_last_grads(bool keep) { keep_last_grads_ = keep; }
  // For tests: this rank's rows of a parameter (fp32 master) and of its
  // gradient as it was right before the last optimizer step.
  absl::StatusOr<at::Tensor> MasterShard(const std::string& name) const;
  absl::StatusOr<at::Tensor> LastGradShard(const std::string& name) const;
  const baton::v1::Program& program() const { return program_; }
  int64_t state_bytes() const;

 private:
  struct Param;
  struct Unit;

  Executor(baton::v1::Program program, CommunicatorMap comms, std::unique_ptr<DataSource> data);
  absl::Status Init();
  absl::Status Execute(const baton::v1::Instruction& ins);
  absl::StatusOr<Communicator*> Comm(const std::string& axis) const;

  absl::Status Gather(Unit& unit);
  absl::Status WaitGather(Unit& unit);
  void Free(Unit& unit);
  absl::Status Forward(int stage, int microbatch);
  absl::Status Backward(int stage, int microbatch);
  absl::Status ReduceScatterGrads(Unit& unit, const std::string& axis);
  absl::Status AllReduceGrads(Unit& unit, const std::string& axis, bool full);
  absl::Status WaitReductions();
  absl::Status ClipGradNorm(const std::string& axis, double max_norm);
  void OptimizerStep();
  absl::Status GatherUpdatedParams(Unit& unit, const std::string& axis);
  absl::Status ReduceLoss(const std::string& axis);
  void ZeroGrad();
  void TrackUnsharded(int64_t delta);

  baton::v1::Program program_;
  CommunicatorMap comms_;
  std::unique_ptr<DataSource> data_;
  at::ScalarType compute_dtype_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::map<std::string, Param*> by_name_;

  // Per-step state.
  int64_t step_ = 0;
  Milliseconds timeout_{kDefaultCollectiveTimeout};
  Batch batch_;
  std::vector<at::Tensor> stage_inputs_, stage_outputs_;
  double loss_sum_ = 0;
  double loss_ = 0;
  double grad_norm_ = 0;
  int64_t unsharded_bytes_ = 0, peak_unsharded_bytes_ = 0;
  struct Pending {
    std::unique_ptr<CommHandle> handle;
    std::function<void()> finish;
    int unit;
    std::string then_all_reduce_axis;  // HSDP: all-reduce the shards once reduced
  };
  absl::Status IssueAllReduce(Unit& unit, const std::string& axis, bool full);
  bool keep_last_grads_ = false;
  std::vector<Pending> pending_;
};

}  // namespace baton

#endif  // BATON_WORKER_EXECUTOR_H_
