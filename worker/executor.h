// Executor: runs one rank's Program, instruction by instruction. It has no
// notion of which parallelism produced the Program: FSDP, HSDP, ZeRO, DDP (and
// pipeline stages) differ only in the layouts and instructions they compile
// to. It routes each instruction to the part that owns the state involved:
//
//   ShardStore       parameters, gradients, AdamW moments (shard_store.h)
//   UnitCollectives  gathers and gradient reductions of whole units
//   Activations      batches, stage inputs/outputs, autograd, send/recv
//   optimizer.h      norms, clipping, AdamW
//
// and keeps the step's metrics: the loss (global after REDUCE_METRICS),
// tokens, bytes sent, state and peak unsharded bytes.
//
// Thread-safety: one thread drives an Executor; collectives run on the
// communicators' own threads.
#ifndef BATON_WORKER_EXECUTOR_H_
#define BATON_WORKER_EXECUTOR_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/program.pb.h"
#include "proto/trace.pb.h"
#include "worker/activations.h"
#include "worker/caching_allocator.h"
#include "worker/groups.h"
#include "worker/shard_store.h"
#include "worker/step_detail.h"
#include "worker/unit_collectives.h"

namespace baton {

class Executor {
 public:
  // Validates `program` (program/program_check.h), initialises this rank's
  // pieces and opens its data. `comms` maps "world" and every mesh axis to
  // this rank's communicator.
  // Its tensors live on `device`, the worker's (worker/device/device.h): on
  // a CUDA device its steps' times come from CUDA events, its memory figures
  // from LibTorch's caching allocator, and it ends each step by draining the
  // communicators' device collectives.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const baton::v1::Program& program,
                                                          CommunicatorMap comms, at::Device device = at::kCPU);

  // Runs step `step` (1-based, consecutive). `detail`, when given, gets the
  // step's figures that only the worker uses; `trace`, when given, a span
  // per instruction (worker/step_tracer.h).
  absl::StatusOr<baton::v1::StepMetrics> RunStep(int64_t step, Milliseconds timeout, StepDetail* detail = nullptr,
                                                 baton::v1::StepTrace* trace = nullptr);

  // For tests: keep a copy of each gradient piece as the optimizer applied
  // it (off by default: it costs a copy of the gradients).
  void set_keep_last_grads(bool keep) { keep_last_grads_ = keep; }
  // For tests: each step's compute takes `fraction` more (a slow rank; its
  // peers then wait for it in their collectives).
  void set_testing_slow_compute(double fraction) { testing_slow_compute_ = fraction; }
  // For tests: this rank's piece of a parameter (fp32 master) and of its
  // gradient as the last optimizer step applied it.
  absl::StatusOr<at::Tensor> MasterShard(const std::string& name) const;
  absl::StatusOr<at::Tensor> LastGradShard(const std::string& name) const;
  const baton::v1::Program& program() const { return program_; }
  // The state a checkpoint saves and loads (worker/checkpoint_io.h).
  ShardStore& store() { return *store_; }
  const ShardStore& store() const { return *store_; }
  // Steps completed; a restored job continues from the checkpoint's.
  int64_t step() const { return step_; }
  void ResumeAt(int64_t step) { step_ = committed_step_ = step; }
  // The step the state is at: the last step whose OPTIMIZER_STEP completed.
  // A step is committed all-or-none: one that failed before its optimizer
  // left the state as the previous step left it.
  int64_t committed_step() const { return committed_step_; }
  // Awaits whatever is in flight and hands over the state (the job's mesh
  // is gone; the worker keeps it for recovery). The Executor is unusable
  // afterwards.
  std::unique_ptr<ShardStore> TakeStore();
  int64_t state_bytes() const { return store_->state_bytes(); }

 private:
  Executor(baton::v1::Program program, Groups groups)
      : cache_user_(program.expected_tensor_bytes()), program_(std::move(program)), groups_(std::move(groups)) {}
  absl::Status Execute(const baton::v1::Instruction& ins);
  absl::StatusOr<ShardStore::Unit*> Unit(int index);
  absl::Status ReduceMetrics(const baton::v1::Instruction& ins);
  // The mesh axes an instruction's group spans, as indices.
  // Completes everything in flight (after a failure too: nothing may still
  // write into tensors the next step reuses).
  absl::Status AwaitTransfers();

  // Declared first, so destroyed last: the job's blocks are cached for reuse
  // while it lives, and go back to the system after its tensors
  // (worker/caching_allocator.h).
  CacheUser cache_user_;
  const baton::v1::Program program_;
  const Groups groups_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<UnitCollectives> collectives_;
  std::unique_ptr<Activations> activations_;

  int64_t step_ = 0;
  int64_t committed_step_ = 0;
  Milliseconds timeout_{kDefaultCollectiveTimeout};
  double loss_ = 0;
  double grad_norm_ = 0;
  bool keep_last_grads_ = false;
  double testing_slow_compute_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_EXECUTOR_H_
