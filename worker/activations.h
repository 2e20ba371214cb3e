// Activations: one step's microbatches and what flows between stages, keyed
// by (stage, microbatch), and the autograd passes over them.
//
//   FORWARD(s, mb)   the input is what RECV_ACTIVATION put there, else the
//                    output of stage s-1 for mb on this rank, detached: every
//                    stage is its own autograd graph, so a unit's parameters
//                    can be freed between its forward and its backward
//   BACKWARD(s, mb)  the output's gradient is what RECV_GRAD put there, else
//                    the gradient of stage s+1's input on this rank, or, for
//                    a loss stage, 1 / microbatches; then the unit's
//                    parameter gradients move into their fp32 accumulators
//   SEND_ACTIVATION / SEND_GRAD  the stage's output / its input's gradient
//                    to the peer, asynchronously: each one's tensor goes when
//                    its send is done (SendReaper); all are done before the
//                    step ends
//   RECV_ACTIVATION / RECV_GRAD  into the stage's input / output gradient
//
// Not thread-safe: the Executor's thread drives it.
#ifndef BATON_WORKER_ACTIVATIONS_H_
#define BATON_WORKER_ACTIVATIONS_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/program.pb.h"
#include "worker/groups.h"
#include "worker/model/data.h"
#include "worker/send_reaper.h"
#include "worker/shard_store.h"

namespace baton {

class Activations {
 public:
  Activations(const baton::v1::Program& program, ShardStore* store, const Groups* groups,
              std::unique_ptr<DataSource> data)
      : program_(program), store_(store), groups_(groups), data_(std::move(data)) {}
  ~Activations();

  // Forgets the last step's tensors and counters; `timeout` bounds every
  // collective of the step's stages (tensor parallelism) and sends.
  void BeginStep(int64_t step, Milliseconds timeout);
  absl::Status LoadBatch(const baton::v1::Instruction& ins);
  absl::Status Forward(int stage, int microbatch);
  absl::Status Backward(int stage, int microbatch);
  absl::Status Send(const baton::v1::Instruction& ins);
  absl::Status Recv(const baton::v1::Instruction& ins);
  // Completes the step's sends; the first failure, if any.
  absl::Status WaitSends();

  // Sum over this step's microbatches of the loss this rank computed.
  // Reads a device's sum (a host synchronisation: once per step).
  double loss_sum() const { return device_loss_sum_.defined() ? device_loss_sum_.item<double>() : loss_sum_; }
  // Tokens this step's batches carried.
  int64_t tokens() const { return tokens_; }
  // The most logits one microbatch's loss stage held on this rank.
  int64_t peak_logits_elements() const { return peak_logits_; }
  // The most microbatches whose activations were held for backward at once.
  int peak_live_microbatches() const { return peak_live_; }
  // The most bytes of stage outputs held for backward at once.
  int64_t peak_live_activation_bytes() const { return peak_live_bytes_; }
  // Time spent waiting to receive from other stages this step.
  double idle_ms() const { return idle_ms_; }
  // This step's time blocked in WaitSends (until its sends were received).
  double send_wait_ms() const { return send_wait_ms_; }

 private:
  struct Entry {
    at::Tensor input, output, output_grad;
  };
  using Key = std::pair<int, int>;  // (stage, microbatch)
  using Entries = std::map<Key, Entry>;

  // The entry of `key`, made if missing, and dropping one: both keep
  // entries_per_microbatch_ (the live microbatches) in step with entries_.
  Entry& EntryOf(const Key& key);
  void Drop(Entries::iterator it);

  // The unit of `stage` with its parameters ready, or nullptr for a stage
  // without parameters.
  absl::StatusOr<ShardStore::Unit*> StageUnit(int stage);
  // Runs `stage`'s forward on `entry`'s input (microbatch `microbatch`),
  // autograd recording unless the caller disabled it.
  absl::StatusOr<at::Tensor> RunStage(int stage, int microbatch, const Entry& entry, int64_t* logits);
  // The context-parallel group of the Program's sequence layout (one it has).
  absl::StatusOr<ContextParallelGroup> ContextGroup() const;

  const baton::v1::Program& program_;
  ShardStore* const store_;
  const Groups* const groups_;
  std::unique_ptr<DataSource> data_;

  int64_t step_ = 0;
  Milliseconds timeout_{kDefaultCollectiveTimeout};
  std::map<int, Batch> batches_;  // by microbatch
  Entries entries_;
  std::map<int, int> entries_per_microbatch_;
  SendReaper sends_;
  double loss_sum_ = 0;
  at::Tensor device_loss_sum_;  // on a device: the sum, still there
  int64_t tokens_ = 0;
  int64_t peak_logits_ = 0;
  int peak_live_ = 0;
  int64_t live_bytes_ = 0, peak_live_bytes_ = 0;
  double idle_ms_ = 0;
  double send_wait_ms_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_ACTIVATIONS_H_
